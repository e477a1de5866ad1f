"""``perf --url`` of a server that trtdeploy did not start here: the workload told from the served model's
configuration (or named with --workload), the tokenizer an LLM needs, HTTP, and what summary.json and the report
say of such a run. The servers are the real tritonserver, launched without a record, as a remote host is."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from trtdeploy import TextLLMOptions, TextLLMSpec, hookimpl
from trtdeploy.errors import NetworkError, NotFoundError, UsageError
from trtdeploy.perf.workload import ModelInfo, TensorSpec
from trtdeploy.plugins import forget_registrations, pm
from trtdeploy.remote import choose_workload, recognized_by

from .test_asr_target import whisper_deployment


def _model(name: str, inputs: tuple[str, ...], outputs: tuple[str, ...], **config: object) -> ModelInfo:
    def specs(names: tuple[str, ...]) -> dict[str, TensorSpec]:
        return {each: TensorSpec(each, "BYTES", (1,)) for each in names}

    return ModelInfo(name, specs(inputs), specs(outputs), max_batch_size=4, **config)


TEXT = (("text_input", "max_tokens", "stream"), ("text_output", "output_ids"))
TOKENS = (("input_ids", "input_lengths", "request_output_len", "streaming"), ("output_ids", "sequence_length"))
TTS = (("reference_wav", "reference_wav_len", "reference_text", "target_text"), ("waveform",))
ASR = (("TEXT_PREFIX", "WAV", "WAV_LENS"), ("TRANSCRIPTS",))


@pytest.mark.plugins("cosyvoice", "llama_llm", "qwen_llm", "spark_tts", "whisper")
@pytest.mark.parametrize(
    ("model", "workloads"),
    [
        # TensorRT-LLM's own text ensemble names no model: every text LLM speaks it (the first is taken: they load it
        # alike, test below)
        (_model("ensemble", *TEXT), ["llama_llm", "mistral_llm", "qwen_llm"]),
        (_model("ensemble", *TEXT, parameters={"text_llm": "mistral_llm"}), ["mistral_llm"]),
        (_model("tensorrt_llm", *TOKENS, decoupled=True), ["tensorrt_llm"]),
        (_model("whisper_bls", *ASR), ["whisper"]),
        # Spark-TTS and CosyVoice share the TTS tensors: each is told by its name or by its configuration's parameters
        (_model("spark_tts", *TTS, decoupled=True), ["spark_tts"]),
        (
            _model("voice", *TTS, parameters={"chunk_overlap_seconds": "0.1", "stream_format": "overlapped"}),
            ["spark_tts"],
        ),
        (_model("cosyvoice3_offline", *TTS), ["cosyvoice3"]),
        (_model("voice", (*TTS[0], "speaker_id"), TTS[1], parameters={"generation": "cosyvoice2"}), ["cosyvoice2"]),
        (_model("voice", *TTS), []),
        (_model("audio_tokenizer", ("reference_wav", "reference_wav_len"), ("global_tokens", "semantic_tokens")), []),
    ],
)
def test_each_model_plugin_recognizes_its_own_entry_model_alone(model, workloads):
    assert recognized_by(model, warn=pytest.fail) == workloads


@pytest.mark.plugins("qwen_llm")
def test_a_model_whose_plugin_is_not_installed_is_recognized_by_none():
    assert recognized_by(_model("whisper_bls", *ASR), warn=pytest.fail) == []
    assert recognized_by(_model("ensemble", *TEXT), warn=pytest.fail) == ["qwen_llm"]


@dataclass(frozen=True)
class _ChatOptions(TextLLMOptions):
    chat_template: bool = True


class _ChatLLM(TextLLMSpec):
    name = "test_chat_llm"
    default_repo = "test/chat-llm"
    architectures = ("Qwen2ForCausalLM",)
    Options = _ChatOptions


class _ChatPlugin:
    @hookimpl
    def register_models(self, register):
        register(_ChatLLM())


@pytest.mark.plugins("llama_llm", "qwen_llm")
def test_an_ensemble_naming_no_model_goes_to_the_text_llms_only_while_they_would_load_it_alike():
    unnamed = _model("ensemble", *TEXT)
    alike = recognized_by(unnamed, warn=pytest.fail)
    assert sorted(alike) == ["llama_llm", "mistral_llm", "qwen_llm"]
    assert choose_workload(unnamed, "localhost:1", None, pytest.fail) == alike[0]
    # a text LLM whose deployments wrap prompts in the chat template: which one loads it changes the requests
    pm.register(_ChatPlugin(), name="test-chat-llm")
    forget_registrations()
    try:
        with pytest.raises(UsageError, match="recognized by several workloads: .*test_chat_llm"):
            choose_workload(unnamed, "localhost:1", None, pytest.fail)
        named = _model("ensemble", *TEXT, parameters={"text_llm": "test_chat_llm"})
        assert choose_workload(named, "localhost:1", None, pytest.fail) == "test_chat_llm"
    finally:
        pm.unregister(name="test-chat-llm")
        forget_registrations()


def test_spark_tts_streams_as_its_served_configuration_says():
    from trtdeploy.plugins import get_model

    spark = get_model("spark_tts")
    overlapped = _model("spark_tts", *TTS, decoupled=True, parameters={"chunk_overlap_seconds": "0.2"})
    assert spark.served_workload(overlapped, tokenizer_dir=None).chunk_overlap_samples == 3200  # 16 kHz
    finished = _model("spark_tts", *TTS, decoupled=True, parameters={"stream_format": "finished"})
    assert spark.served_workload(finished, tokenizer_dir=None).chunk_overlap_samples == 0
    official = _model("spark_tts", *TTS, decoupled=True)  # no parameters: the official wire format's 0.1 s
    assert spark.served_workload(official, tokenizer_dir=None).chunk_overlap_samples == 1600
    cosyvoice = get_model("cosyvoice2").served_workload(_model("cosyvoice2", *TTS), tokenizer_dir=None)
    assert (cosyvoice.sample_rate, cosyvoice.decoupled) == (24000, False)


def test_a_tokenizer_is_a_folder_or_a_hub_name(tmp_path, monkeypatch):
    from trtdeploy.download import tokenizer_folder

    assert tokenizer_folder(str(tmp_path)) == tmp_path.resolve()
    for missing in (str(tmp_path / "nope"), "./nope", "a/b/c"):
        with pytest.raises(NotFoundError, match=f"--tokenizer {missing}: no such folder"):
            tokenizer_folder(missing)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NetworkError, match="cannot download someone/some-llm from the Hugging Face Hub") as caught:
        tokenizer_folder("someone/some-llm")
    assert "--tokenizer FOLDER" in caught.value.hint


# --- the CLI against servers that trtdeploy did not start here -------------------------------------------------


@pytest.fixture(autouse=True)
def nothing_recorded(tmp_path, monkeypatch):
    """No server is recorded as trtdeploy's (the ones here are remote to perf), and the current folder is the test's."""
    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)


def perf(capsys, *args: str) -> tuple[int, str]:
    """``trtdeploy perf ARGS``: its exit code, and stdout (code 0) or stderr."""
    from trtdeploy.cli.main import main

    with pytest.raises(SystemExit) as caught:
        main(["perf", *args, "--no-plots"])
    captured = capsys.readouterr()
    code = caught.value.code
    return code, " ".join((captured.out if code == 0 else captured.err).split())


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.server
def test_the_llm_ensemble_is_told_from_its_config_not_from_a_newer_local_deployment(
    fake_server, fake_plugin, make_deployment, tiny_tokenizer, tmp_path, capsys
):
    local = make_deployment()  # under the current folder, newer than anything: not the remote server's
    out = tmp_path / "out"
    args = ["--url", fake_server.grpc_url, "--model", "text_llm", "--tokenizer", str(tiny_tokenizer)]
    code, said = perf(capsys, *args, "--isl", "8", "--osl", "4", "--num-requests", "4", "--output-dir", str(out))
    assert code == 0, said
    assert f"text_llm (offline, grpc) at {fake_server.grpc_url}, qwen_llm workload" in said
    summary = summary_of(out)
    assert summary["deployment"] is None and summary["build"] is None and str(local) not in json.dumps(summary)
    assert summary["remote"] == {"workload": "qwen_llm", "chosen_by": "config", "tokenizer": str(tiny_tokenizer)}
    assert summary["model"] == "text_llm" and summary["workload"] == "TextLLMWorkload"
    level = summary["levels"][0]
    assert level["errors"] == 0 and level["input_tokens"]["min"] == level["input_tokens"]["max"] == 8
    assert level["output_tokens"]["max"] == 4


@pytest.mark.server
def test_the_llm_contract_over_http_counts_with_the_tokenizer(fake_server, tiny_tokenizer, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--url", fake_server.http_url, "--protocol", "http", "--model", "tensorrt_llm_offline", "--isl", "8"]
    code, said = perf(capsys, *args, "--osl", "3", "--tokenizer", str(tiny_tokenizer), "--output-dir", str(out))
    assert code == 0, said
    summary = summary_of(out)
    assert summary["remote"]["workload"] == "tensorrt_llm" and summary["workload"] == "TokenLLMWorkload"
    assert summary["protocol"] == "http" and summary["stream"] is False
    level = summary["levels"][0]
    assert level["errors"] == 0 and level["input_tokens"]["min"] == 8 and level["output_tokens"]["min"] == 3


@pytest.mark.server
@pytest.mark.parametrize(
    ("model", "inputs", "need"),
    [
        ("tensorrt_llm", (), "the token ids it takes and returns need its tokenizer"),
        ("text_llm", (), "synthetic prompts of exactly --isl tokens need its tokenizer"),
        ("text_llm_noids", ("--input-data",), "counting its output tokens (it returns text without output_ids)"),
    ],
)
def test_an_llm_that_needs_a_tokenizer_is_refused_without_one(fake_server, model, inputs, need, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input": "one two three"}\n')
    args = ["--url", fake_server.grpc_url, "--model", model, *(arg for flag in inputs for arg in (flag, str(prompts)))]
    code, said = perf(capsys, *args)
    assert code == 2, said
    assert f"model {model!r} at {fake_server.grpc_url} is an LLM served without a deployment folder here" in said
    assert need in said and "pass --tokenizer" in said
    assert not (tmp_path / "perf-results").exists()


@pytest.mark.server
def test_prompts_with_server_token_ids_need_no_tokenizer(fake_server, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"say {n} words"}) + "\n" for n in range(4)))
    out = tmp_path / "out"
    args = ["--url", fake_server.grpc_url, "--model", "text_llm_stream", "--input-data", str(prompts), "--osl", "3"]
    code, said = perf(capsys, *args, "--output-dir", str(out))
    assert code == 0, said
    level = summary_of(out)["levels"][0]
    assert level["token_source"] == "server" and level["output_tokens"]["min"] == 3
    assert level["input_tokens"] is None  # not counted without the tokenizer


@pytest.mark.server
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "is not one that `trtdeploy serve` started here: name the model to load with --model"),
        (("--model", "text_llm", "--workload", "tensorrt_llm"), "model 'text_llm' has no input 'input_ids'"),
        (("--model", "text_llm", "--workload", "llama"), "--workload 'llama' is not an installed model"),
        (("--model", "text_llm", "--tokenizer", "./nowhere"), "--tokenizer ./nowhere: no such folder"),
    ],
)
def test_remote_usage_errors_are_one_line(fake_server, tiny_tokenizer, args, message, capsys):
    code, said = perf(capsys, "--url", fake_server.grpc_url, "--tokenizer", str(tiny_tokenizer), *args)
    assert code in (2, 3), said
    assert message in said and said.count("Error:") == 1


@pytest.mark.server
def test_workload_and_tokenizer_are_refused_with_a_deployment(
    fake_server, fake_plugin, make_deployment, tiny_tokenizer, capsys
):
    args = [str(make_deployment()), "--url", fake_server.grpc_url, "--workload", "qwen_llm"]
    code, said = perf(capsys, *args, "--tokenizer", str(tiny_tokenizer))
    assert code == 2 and "--workload and --tokenizer tell how to load a server with no deployment folder here" in said


@pytest.fixture(scope="module")
def whisper_server(tmp_path_factory):
    """The fake whisper_bls of a streaming whisper deployment (decoupled, with whisper_bls_offline beside it), on a
    server launched without a record."""
    from trtdeploy.server import launch

    from ..server.helpers import off_default_ports

    root = tmp_path_factory.mktemp("remote-whisper")
    deployment = whisper_deployment(root, "streaming")
    with launch(
        deployment / "model_repo", log_file=root / "tritonserver.log", timeout=120, **off_default_ports()
    ) as server:
        yield server


@pytest.mark.server
def test_http_only_speech_loads_the_offline_model_and_refuses_streaming_by_name(whisper_server, tmp_path, capsys):
    from trtdeploy.perf.report import write_wav

    write_wav(tmp_path / "a.wav", [0.25] + [0.01] * 1599, 16000)
    (tmp_path / "in.jsonl").write_text(json.dumps({"audio": "a.wav", "text": "en 1600 1600 0.25"}) + "\n")
    http = ["--url", whisper_server.http_url, "--protocol", "http", "--input-data", str(tmp_path / "in.jsonl")]
    code, said = perf(capsys, *http, "--model", "whisper_bls")
    assert code == 2, said
    assert "'whisper_bls' is a streaming ASR model (decoupled" in said and "--protocol http cannot load it" in said
    assert "pass --protocol grpc with the server's gRPC port, or --model whisper_bls_offline" in said

    out = tmp_path / "out"
    offline = ["--model", "whisper_bls_offline"]
    code, said = perf(capsys, *http, *offline, "--workload", "whisper", "--output-dir", str(out))
    assert code == 0, said
    summary = summary_of(out)
    assert summary["remote"] == {"workload": "whisper", "chosen_by": "--workload", "tokenizer": None}
    assert summary["family"] == "asr" and summary["stream"] is False and summary["levels"][0]["errors"] == 0
    assert summary["levels"][0]["asr"]["wer_corpus"] == 0

    code, said = perf(capsys, *http, *offline, "--tokenizer", str(tmp_path))
    assert code == 3 and f"no usable tokenizer in {tmp_path}" in said


def test_report_labels_a_remote_run_by_its_workload_and_server(tmp_path):
    from trtdeploy.perf.compare import Run, default_labels

    def run(name: str, **summary: object) -> Run:
        base = {"model": "ensemble", "url": "gpu-host:8001", "protocol": "grpc", "stream": True, "build": None}
        return Run(tmp_path / name, {**base, "remote": {"workload": "qwen_llm"}, **summary}, None)

    labels = default_labels([run("a"), run("b", protocol="http", stream=False), run("c", model="qwen_llm")])
    assert labels == [
        "qwen_llm ensemble @ gpu-host:8001 grpc streaming",
        "qwen_llm ensemble @ gpu-host:8001 http offline",
        "qwen_llm @ gpu-host:8001",
    ]
