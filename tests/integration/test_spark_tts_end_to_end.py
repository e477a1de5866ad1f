"""Spark-TTS through the real command line: build → serve --background → perf (TTS metrics, saved wavs, WER/CER)
→ stop, on a tiny random checkpoint in the official layout.

WER/CER go through ``--asr-url`` to a Triton model with the Whisper contract (the test model of tests/perf, which
answers with a transcript made from its input): the scores are not meaningful, the plumbing is what is checked.
"""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import pytest

from ..conftest import run_cli
from ..server.helpers import leftovers
from .speech import inputs_file

pytestmark = pytest.mark.server

MODELS = Path(__file__).resolve().parents[1] / "perf" / "models"


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> dict[str, str]:
    return {"TRTDEPLOY_STATE_DIR": str(tmp_path_factory.mktemp("state"))}


@pytest.fixture(scope="module")
def served(trtdeploy_checkpoint, tmp_path_factory, state):
    root = tmp_path_factory.mktemp("spark-e2e")
    built = run_cli(
        "build", "spark_tts", "--model-dir", str(trtdeploy_checkpoint("spark_tts")), "--gpu", "cpu",
        "--max-batch-size", "4", "--max-input-len", "1024", "--max-output-len", "200", "--json", cwd=root,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert sorted(json.loads(built.stdout)["triton_models"]) == [
        "audio_tokenizer", "spark_tts", "spark_tts_offline", "tensorrt_llm", "vocoder"
    ]  # fmt: skip
    started = run_cli("serve", "--background", "--json", cwd=root, env=state)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    yield root, info
    stopped = run_cli("stop", "--port", str(info["grpc_port"]), "--json", env=state)
    assert stopped.returncode == 0, stopped.stderr
    assert leftovers(pgid=info["pgid"]) == []


@pytest.fixture(scope="module")
def whisper_url(tmp_path_factory):
    from trtdeploy.server import launch

    from ..server.helpers import off_default_ports

    root = tmp_path_factory.mktemp("whisper")
    shutil.copytree(MODELS / "fake_whisper", root / "repo" / "whisper_bls", ignore=shutil.ignore_patterns("__*"))
    with launch(root / "repo", log_file=root / "tritonserver.log", timeout=120, **off_default_ports()) as server:
        yield server.grpc_url


def test_streaming_perf_reports_tts_metrics_saves_wavs_and_scores_them(served, state, whisper_url, tmp_path):
    root, _ = served
    out = tmp_path / "perf"
    result = run_cli(
        "perf", "--concurrency", "1,4", "--num-requests", "6", "--input-data", str(inputs_file(tmp_path)),
        "--osl", "40", "--asr-url", whisper_url, "--output-dir", str(out), "--json", cwd=root, env=state,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["family"] == "tts" and summary["stream"] is True
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in records if not r["warmup"]]
    assert len(measured) == 12 and all(r["error"] is None for r in records)
    assert all(r["audio_seconds"] == pytest.approx(40 * 320 / 16000) for r in measured)
    assert all(0 < r["first_chunk_ms"] <= r["e2e_ms"] for r in measured)
    assert all(r["rtf"] == pytest.approx(r["e2e_ms"] / 1000 / r["audio_seconds"]) for r in measured)
    for level in summary["levels"]:
        assert level["rtf_aggregate"] > 0 and level["first_chunk_ms"]["p50"] > 0
        assert set(level["e2e_ms"]) >= {"mean", "p50", "p90", "p99"}
        assert level["asr"]["utterances"] == 3 and level["asr"]["languages"] == {"en": 2, "zh": 1}
    saved = sorted(path.relative_to(out).as_posix() for path in out.glob("audio/*/*.wav"))
    assert saved == [f"audio/{level}/utt{i}.wav" for level in ("c1", "c4") for i in range(3)]
    with wave.open(str(out / "audio" / "c4" / "utt1.wav")) as fh:
        assert (fh.getframerate(), fh.getnchannels(), fh.getnframes()) == (16000, 1, 40 * 320)
    scored = [r for r in measured if "audio_file" in r]
    assert len(scored) == 6 and all(set(r["scores"]) == {"wer", "cer"} for r in scored)
    assert all(r["text"].split()[:2] == ["zh" if "天" in r["reference"] else "en", "12800"] for r in scored)


def test_offline_entry_of_the_same_deployment(served, state, tmp_path):
    root, _ = served
    out = tmp_path / "offline"
    result = run_cli(
        "perf", "--model", "spark_tts_offline", "--concurrency", "2", "--num-requests", "4", "--osl", "25",
        "--output-dir", str(out), "--no-plots", "--json", cwd=root, env=state,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    level = summary["levels"][0]
    assert summary["input"] == "synthetic voices and sentences" and summary["stream"] is False
    assert level["errors"] == 0 and level["first_chunk_ms"] is None
    assert level["audio_seconds"] == pytest.approx(4 * 25 * 320 / 16000)


def test_tts_refuses_llm_only_options(served, state):
    root, _ = served
    result = run_cli("perf", "--isl", "16", cwd=root, env=state)
    assert result.returncode == 2 and "--isl" in result.stderr
    result = run_cli("perf", "--asr-url", "localhost:1", "--model", "tensorrt_llm", cwd=root, env=state)
    assert result.returncode == 2 and "--asr-url scores speech" in result.stderr


def test_a_failing_asr_costs_the_scores_not_the_measurements(served, whisper_url, tmp_path):
    """Whisper answers an error (the test model refuses language ``xx``) after the load: the reports are written,
    then the run fails naming the utterance."""
    from trtdeploy.benchmark import PerfSettings, benchmark
    from trtdeploy.errors import PerfError
    from trtdeploy.perf.asr import AsrSettings
    from trtdeploy.perf.runner import InputSpec, LoadSettings

    _, info = served
    out = tmp_path / "perf"
    settings = PerfSettings(
        deployment=Path(info["deployment"]),
        url=f"localhost:{info['grpc_port']}",
        load=LoadSettings(concurrency=(1,), num_requests=2),
        inputs=InputSpec(input_data=inputs_file(tmp_path), osl=10),
        output_dir=out,
        plots=False,
        asr=AsrSettings(url=whisper_url, language="xx"),
    )
    warnings: list[str] = []
    with pytest.raises(PerfError, match=r"ASR request for utterance \d failed .*no language xx"):
        benchmark(settings, warn=warnings.append)
    assert "no WER/CER" in warnings[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["levels"][0]["completed"] == 2 and "asr" not in summary["levels"][0]
    assert len(list(out.glob("audio/c1/*.wav"))) == 2


def test_the_server_as_a_remote_host_sees_it(served, tmp_path):
    """Without the server's record (a remote host's server): the workload is told from the configuration of the
    model loaded, streams as that configuration says, and over HTTP the streaming entry is refused by name while
    its offline twin is loaded. The deployment folder under the current folder is not used."""
    root, info = served
    remote = {"TRTDEPLOY_STATE_DIR": str(tmp_path / "no-records")}
    inputs = ["--input-data", str(inputs_file(tmp_path)), "--num-requests", "2", "--warmup", "0", "--osl", "40"]
    grpc, http = ["--url", f"localhost:{info['grpc_port']}"], ["--url", f"localhost:{info['http_port']}"]
    http += ["--protocol", "http"]
    for model, target in (("spark_tts", grpc), ("spark_tts_offline", http)):
        out = tmp_path / model
        args = ["perf", *target, "--model", model, *inputs, "--output-dir", str(out), "--no-plots", "--json"]
        result = run_cli(*args, cwd=root, env=remote)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["remote"] == {"workload": "spark_tts", "chosen_by": "config", "tokenizer": None}
        assert summary["deployment"] is None and summary["stream"] is (model == "spark_tts")
        records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        # the overlap of streamed chunks is read from the configuration's parameters: whole audio, exactly
        assert all(r["error"] is None and r["audio_seconds"] == pytest.approx(40 * 320 / 16000) for r in records)

    result = run_cli("perf", *http, "--model", "spark_tts", *inputs, cwd=root, env=remote)
    assert result.returncode == 2
    said = " ".join(result.stderr.split())
    assert "'spark_tts' is a streaming TTS model (decoupled: it sends its audio over a stream)" in said
    assert "pass --protocol grpc with the server's gRPC port, or --model spark_tts_offline" in said
    result = run_cli("perf", *grpc, "--model", "audio_tokenizer", *inputs, cwd=root, env=remote)
    assert result.returncode == 2
    assert "no installed workload recognizes model 'audio_tokenizer'" in result.stderr and "--workload" in result.stderr
