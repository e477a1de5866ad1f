"""The ASR workload: WER/CER under Whisper's normalisers, its inputs, its requests, and runs against the fake
whisper_bls (tests/perf/models/fake_whisper) on the real server, offline and streaming."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from trtdeploy.errors import NotFoundError, UsageError
from trtdeploy.perf.asr_workload import (
    ASRWorkload,
    load_asr_dataset,
    load_asr_input,
    score_transcript,
    synthetic_duration,
)
from trtdeploy.perf.report import write_wav
from trtdeploy.perf.runner import Endpoint, LoadSettings, run_levels
from trtdeploy.perf.workload import InputRow, ModelInfo, RequestOptions, TensorSpec

from .conftest import write_fake_whisper
from .helpers import level, record, summarize_level

PREFIX_EN = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
PREFIX_ZH = "<|startoftranscript|><|zh|><|transcribe|><|notimestamps|>"


# --- scoring ---------------------------------------------------------------------------------------------------


def test_english_goes_through_whispers_english_normaliser():
    # "Mr." -> "mister", "colours" -> "colors" (the spelling map), "two" -> "2", "Smith's" -> "smith is"
    result = score_transcript("mister smiths two colors", "Mr. Smith's 2 colours", "en")
    assert result["reference_normalized"] == "mister smith is 2 colors"
    assert result["hypothesis_normalized"] == "mister smiths 2 colors"
    # mister=mister, smith->smiths (substitution), "is" deleted, 2=2, colors=colors
    assert (result["hits"], result["substitutions"], result["deletions"], result["insertions"]) == (3, 1, 1, 0)
    assert (result["metric"], result["errors"], result["reference_length"], result["rate"]) == ("wer", 2, 5, 0.4)


def test_english_fillers_punctuation_and_numbers_do_not_count():
    result = score_transcript("Um, I have one hundred and twenty three apples!", "i have 123 apples", "en")
    assert result["hypothesis_normalized"] == "i have 123 apples" and result["rate"] == 0.0


def test_chinese_is_scored_per_character_after_the_basic_normaliser():
    result = score_transcript("你好世间呀", "你好，世界！", "zh")
    assert result["reference_normalized"] == "你好 世界"  # punctuation becomes a space, dropped when aligning
    # 你=你 好=好 世=世, 界->间 (substitution), 呀 inserted: 2 errors in 4 characters
    assert (result["substitutions"], result["deletions"], result["insertions"]) == (1, 0, 1)
    assert (result["metric"], result["reference_length"], result["rate"]) == ("cer", 4, 0.5)


def test_other_languages_use_the_basic_normaliser_per_word():
    result = score_transcript("bonjour monde", "Bonjour, le Monde !", "fr")
    assert result["reference_normalized"] == "bonjour le monde"
    assert (result["metric"], result["deletions"], result["rate"]) == ("wer", 1, pytest.approx(1 / 3))


def test_an_empty_reference_rates_its_insertions():
    assert score_transcript("", "!?", "en")["rate"] == 0.0
    inserted = score_transcript("yes indeed", "!!!", "en")
    assert (inserted["insertions"], inserted["reference_length"], inserted["rate"]) == (2, 0, 1.0)


def test_level_summary_has_mean_and_corpus_rates_latency_and_rtf():
    """Two English utterances (1 error in 1 word, 0 in 9), one Chinese (1 in 4 characters), one unscored."""
    scored = [
        ("hullo", "hello", "en"),
        ("the quick brown fox jumps over the lazy dog", "The quick brown fox jumps over the lazy dog.", "en"),
        ("你好世间", "你好世界", "zh"),
    ]
    records = []
    for index, (send, end, audio) in enumerate([(0, 500, 2.0), (100, 1100, 4.0), (200, 400, 1.0), (300, 700, 3.0)]):
        rec = record(send, end, seq=index)
        rec.audio_seconds = audio
        rec.accuracy = score_transcript(*scored[index]) if index < len(scored) else None
        records.append(rec)
    summary = summarize_level(records, level(num_requests=4), stream=False, family="asr", slo="rtf<=0.2")
    assert summary["audio_seconds"] == 10.0
    assert summary["rtf_aggregate"] == pytest.approx(1.1 / 10)  # window 0 .. 1100 ms
    assert summary["audio_seconds_per_second"] == pytest.approx(10 / 1.1)
    # per request: 0.5 s / 2 s, 1.0 / 4, 0.2 / 1, 0.4 / 3
    assert summary["rtf"]["max"] == pytest.approx(0.25) and summary["rtf"]["min"] == pytest.approx(0.4 / 3)
    assert summary["e2e_ms"]["p50"] == pytest.approx(450) and summary["first_partial_ms"] is None
    assert summary["goodput"] == pytest.approx(2 / 1.1)  # the last two have an RTF <= 0.2
    asr = summary["asr"]
    assert (asr["scored"], asr["unscored"], asr["languages"]) == (3, 1, {"en": 2, "zh": 1})
    assert asr["unscored_reason"] == "no reference transcript"
    assert asr["wer_mean"] == pytest.approx(0.5) and asr["wer_corpus"] == pytest.approx(1 / 10)
    assert (asr["word_errors"], asr["words"], asr["word_substitutions"]) == (1, 10, 1)
    assert asr["cer_mean"] == asr["cer_corpus"] == 0.25 and asr["chars"] == 4 and asr["cer_utterances"] == 1
    assert summary["accuracy"] is None  # exact match and ROUGE are for LLM answers


# --- inputs ----------------------------------------------------------------------------------------------------


def tone(seconds: float, rate: int, first: float = 0.1) -> np.ndarray:
    samples = (0.3 * np.sin(2 * np.pi * 200 * np.arange(int(seconds * rate)) / rate)).astype(np.float32)
    samples[0] = first
    return samples


def test_kaldi_manifest_folder(tmp_path: Path) -> None:
    write_wav(tmp_path / "wavs" / "u1.wav", tone(0.5, 16000), 16000)
    write_wav(tmp_path / "u2.wav", tone(0.25, 8000), 8000)
    (tmp_path / "wav.scp").write_text(f"u1 wavs/u1.wav\n\nu2 {tmp_path / 'u2.wav'}\n")
    (tmp_path / "text").write_text("u2 今天 天气\nu1 HELLO   there world\n")
    rows = load_asr_input(tmp_path)
    assert [row.fields["id"] for row in rows] == ["u1", "u2"]
    assert [row.reference for row in rows] == ["HELLO there world", "今天 天气"]
    assert [(row.fields["sample_rate"], row.fields["samples"].size) for row in rows] == [(16000, 8000), (8000, 2000)]
    assert load_asr_input(tmp_path / "wav.scp")[0].input == "u1"


def test_manifest_with_triton_asr_clients_trans_txt_or_no_transcripts(tmp_path: Path) -> None:
    write_wav(tmp_path / "a.wav", tone(0.1, 16000), 16000)
    (tmp_path / "wav.scp").write_text("a a.wav\n")
    assert load_asr_input(tmp_path)[0].reference is None  # timing only: no transcripts
    (tmp_path / "trans.txt").write_text("a one two\n")
    assert load_asr_input(tmp_path)[0].reference == "one two"


@pytest.mark.parametrize(
    ("scp", "text", "message"),
    [
        ("a a.wav\nb a.wav\n", "a x\n", r"wav.scp:2: utterance 'b' has no transcript in .*text"),
        ("a sox a.wav -t wav - |\n", "a x\n", r"wav.scp:1: expected `ID PATH`"),
        ("a a.wav\na a.wav\n", "a x\n", r"wav.scp:2: utterance 'a' is listed twice \(first at .*wav.scp:1\)"),
        ("a missing.wav\n", "a x\n", r"wav.scp:1: audio file .*missing.wav does not exist"),
    ],
)
def test_bad_manifests_name_the_line(tmp_path: Path, scp: str, text: str, message: str) -> None:
    write_wav(tmp_path / "a.wav", tone(0.1, 16000), 16000)
    (tmp_path / "wav.scp").write_text(scp)
    (tmp_path / "text").write_text(text)
    with pytest.raises((UsageError, NotFoundError), match=message):
        load_asr_input(tmp_path)


def test_jsonl_rows(tmp_path: Path) -> None:
    write_wav(tmp_path / "a.wav", tone(0.2, 24000), 24000)
    lines = [
        {"audio": "a.wav", "text": "good day", "id": "first"},
        {"audio": str(tmp_path / "a.wav"), "text": "你好", "language": "zh", "max_tokens": 7},
        {"audio": "a.wav"},
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    rows = load_asr_input(tmp_path / "in.jsonl")
    assert [row.reference for row in rows] == ["good day", "你好", None]
    assert [row.fields["language"] for row in rows] == [None, "zh", None]
    assert [row.max_tokens for row in rows] == [None, 7, None] and rows[0].fields["id"] == "first"
    (tmp_path / "bad.jsonl").write_text('{"text": "no audio"}\n')
    with pytest.raises(UsageError, match=r'bad.jsonl:1: no "audio" key'):
        load_asr_input(tmp_path / "bad.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"audio": "a.wav", "language": "English"}\n')
    with pytest.raises(UsageError, match="'English' is not a Whisper language code"):
        load_asr_input(tmp_path / "bad.jsonl")


def test_local_dataset_folder_with_an_audio_feature(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    for index, rate in enumerate((16000, 44100)):
        write_wav(tmp_path / f"{index}.wav", tone(0.5, rate), rate)
    data = {"audio": [str(tmp_path / "0.wav"), str(tmp_path / "1.wav")], "sentence": ["Hi there.", "Bye now."]}
    data["id"] = ["s0", "s1"]
    dataset = datasets.Dataset.from_dict(data).cast_column("audio", datasets.Audio())
    dataset.save_to_disk(str(tmp_path / "ds"))
    for name in ("0.wav", "1.wav"):
        (tmp_path / name).unlink()  # the saved dataset holds the audio itself
    rows = load_asr_dataset(str(tmp_path / "ds"), split=None, audio_column=None, reference_column=None)
    assert [row.reference for row in rows] == ["Hi there.", "Bye now."]
    assert [(row.fields["sample_rate"], row.fields["samples"].size) for row in rows] == [(16000, 8000), (44100, 22050)]
    assert [row.fields["id"] for row in rows] == ["s0", "s1"]
    renamed = datasets.load_from_disk(str(tmp_path / "ds")).rename_columns({"audio": "speech", "sentence": "words"})
    renamed.save_to_disk(str(tmp_path / "renamed"))
    rows = load_asr_dataset(str(tmp_path / "renamed"), split=None, audio_column="speech", reference_column="words")
    assert rows[1].reference == "Bye now."
    with pytest.raises(NotFoundError, match="no column 'audio'") as caught:
        load_asr_dataset(str(tmp_path / "renamed"), split=None, audio_column=None, reference_column=None)
    assert "--column" in caught.value.hint and "speech" in caught.value.hint


def test_synthetic_speech_is_deterministic_per_seed_and_has_no_reference():
    workload = ASRWorkload("whisper_bls", decoupled=False)
    first = workload.synthetic_rows(3, input_tokens=128, output_tokens=None, seed=7)
    again = workload.synthetic_rows(3, input_tokens=128, output_tokens=None, seed=7)
    other = workload.synthetic_rows(3, input_tokens=128, output_tokens=None, seed=8)
    for a, b, c in zip(first, again, other, strict=True):
        assert np.array_equal(a.fields["samples"], b.fields["samples"])
        assert not np.array_equal(a.fields["samples"], c.fields["samples"])
        assert a.reference is None and a.fields["sample_rate"] == 16000
        assert 2.0 <= a.fields["samples"].size / 16000 <= 35.0 and np.abs(a.fields["samples"]).max() == 0.5
    assert [row.fields["id"] for row in first] == ["synthetic-0000", "synthetic-0001", "synthetic-0002"]
    assert workload.synthetic_rows(1, input_tokens=1, output_tokens=9, seed=0)[0].max_tokens == 9


def test_synthetic_durations_look_like_librispeech_test_clean():
    rng = np.random.default_rng(0)
    durations = np.array([synthetic_duration(rng) for _ in range(2000)])
    assert durations.min() >= 2.0 and durations.max() <= 35.0
    assert 6.8 < durations.mean() < 8.0 and 5.5 < np.median(durations) < 6.8  # test-clean: 7.4 s mean


# --- requests --------------------------------------------------------------------------------------------------


def whisper_model(*optional: str, decoupled: bool = False) -> ModelInfo:
    inputs = {
        "TEXT_PREFIX": TensorSpec("TEXT_PREFIX", "BYTES", (1,)),
        "WAV": TensorSpec("WAV", "FP32", (-1,)),
        "WAV_LENS": TensorSpec("WAV_LENS", "INT32", (1,)),
    }
    kinds = {"MAX_NEW_TOKENS": "INT32", "IGNORE_EOS": "BOOL", "SAMPLE_RATE": "INT32"}
    inputs |= {name: TensorSpec(name, kinds[name], (1,), optional=True) for name in optional}
    outputs = {"TRANSCRIPTS": TensorSpec("TRANSCRIPTS", "BYTES", (1,))}
    return ModelInfo("whisper_bls", inputs, outputs, max_batch_size=8, decoupled=decoupled)


def row(reference: str | None = None, language: str | None = None, rate: int = 8000, max_tokens=None) -> InputRow:
    fields = {"id": "u", "samples": tone(0.5, rate), "sample_rate": rate, "language": language}
    return InputRow(input="u", reference=reference, max_tokens=max_tokens, fields=fields)


def test_request_tensors_and_prefix_by_language():
    workload, model = ASRWorkload("whisper_bls", decoupled=False), whisper_model("SAMPLE_RATE")
    request = workload.make_request(row("good day"), RequestOptions(), model)
    assert request.inputs["TEXT_PREFIX"].tolist() == [[PREFIX_EN.encode()]]
    wav = request.inputs["WAV"]
    assert wav.shape == (1, 8000) and wav.dtype == np.float32  # 0.5 s at 8 kHz, resampled to 16 kHz
    assert request.inputs["WAV_LENS"].tolist() == [[8000]] and request.inputs["SAMPLE_RATE"].tolist() == [[16000]]
    assert set(request.inputs) == {"TEXT_PREFIX", "WAV", "WAV_LENS", "SAMPLE_RATE"}
    assert request.context.audio_seconds == 0.5 and request.outputs == ("TRANSCRIPTS",)
    chinese = workload.make_request(row("今天天气很好"), RequestOptions(), model)  # told from the reference
    assert chinese.inputs["TEXT_PREFIX"].tolist() == [[PREFIX_ZH.encode()]]
    named = workload.make_request(row(None, language="zh"), RequestOptions(), model)
    assert named.inputs["TEXT_PREFIX"].tolist() == [[PREFIX_ZH.encode()]]
    forced = workload.make_request(row("今天天气很好"), RequestOptions(text_prefix=PREFIX_EN), model)
    assert forced.inputs["TEXT_PREFIX"].tolist() == [[PREFIX_EN.encode()]] and forced.context.language == "en"


def test_an_utterances_length_is_shared_out_over_its_30_second_windows():
    """whisper_bls caps each 30 s window: 70 s of audio asking for 91 tokens asks 31 of each of its 3 windows."""
    workload, model = ASRWorkload("whisper_bls", decoupled=False), whisper_model("MAX_NEW_TOKENS", "IGNORE_EOS")
    fields = {"id": "u", "samples": np.zeros(70 * 16000, np.float32), "sample_rate": 16000, "language": None}
    long = InputRow(input="u", reference=None, max_tokens=91, fields=fields)
    request = workload.make_request(long, RequestOptions(ignore_eos=True), model)
    assert request.inputs["MAX_NEW_TOKENS"].tolist() == [[31]]


def test_exact_lengths_are_sent_only_when_asked_and_declared():
    workload = ASRWorkload("whisper_bls", decoupled=False)
    model = whisper_model("MAX_NEW_TOKENS", "IGNORE_EOS")
    plain = workload.make_request(row("hi"), RequestOptions(), model)
    assert "MAX_NEW_TOKENS" not in plain.inputs and "IGNORE_EOS" not in plain.inputs
    exact = RequestOptions(max_tokens=12, ignore_eos=True)
    workload.validate(model, exact)
    request = workload.make_request(row("hi"), exact, model)
    assert request.inputs["MAX_NEW_TOKENS"].tolist() == [[12]] and request.inputs["IGNORE_EOS"].tolist() == [[True]]
    per_row = workload.make_request(row("hi", max_tokens=5), exact, model)  # the row's own length wins
    assert per_row.inputs["MAX_NEW_TOKENS"].tolist() == [[5]]
    with pytest.raises(UsageError, match="--ignore-eos needs a length for every request") as caught:
        workload.make_request(row("hi"), RequestOptions(ignore_eos=True), model)
    assert "--osl" in caught.value.hint


def test_a_model_without_the_length_inputs_refuses_exact_lengths():
    workload, official = ASRWorkload("whisper_bls", decoupled=False), whisper_model()
    workload.validate(official, RequestOptions())
    with pytest.raises(UsageError, match="takes no MAX_NEW_TOKENS or IGNORE_EOS") as caught:
        workload.validate(official, RequestOptions(max_tokens=4, ignore_eos=True))
    assert "drop --osl and --ignore-eos" in caught.value.hint
    with pytest.raises(UsageError, match="asks for max_tokens 3, but model 'whisper_bls' takes no MAX_NEW_TOKENS"):
        workload.make_request(row("hi", max_tokens=3), RequestOptions(), official)
    with pytest.raises(UsageError, match="no input 'temperature'"):
        workload.validate(official, RequestOptions(temperature=0.5))


def test_a_stream_is_scored_on_its_last_transcript():
    workload = ASRWorkload("whisper_bls", decoupled=True)
    request = workload.make_request(row("Hello there world."), RequestOptions(stream=True), whisper_model())
    chunks = [workload.parse_chunk({"TRANSCRIPTS": np.array([[text.encode()]], dtype=object)}, request) for text in
              ("", " Hello", " Hello there", " Hello there word")]  # fmt: skip
    assert [chunk.has_content for chunk in chunks] == [False, True, True, True]
    result = workload.finish(request, [chunk for chunk in chunks if chunk.has_content])
    assert result.text == "Hello there word" and result.audio_seconds == 0.5
    assert result.accuracy["substitutions"] == 1 and result.accuracy["rate"] == pytest.approx(1 / 3)
    assert workload.finish(request, []).accuracy["deletions"] == 3  # nothing heard


# --- against the fake whisper_bls on the real server -----------------------------------------------------------


@pytest.fixture(scope="module")
def whisper_server(tmp_path_factory: pytest.TempPathFactory):
    """The fake Whisper as whisper_bls (with the length inputs), whisper_stream (decoupled) and whisper_official
    (NVIDIA's inputs only)."""
    from trtdeploy.server import launch

    from ..server.helpers import off_default_ports

    root = tmp_path_factory.mktemp("asr-workload")
    write_fake_whisper(root / "repo" / "whisper_bls")
    write_fake_whisper(root / "repo" / "whisper_stream", decoupled=True)
    write_fake_whisper(root / "repo" / "whisper_official", length_inputs=False)
    with launch(root / "repo", log_file=root / "tritonserver.log", timeout=120, **off_default_ports()) as server:
        yield server


def endpoint(server) -> Endpoint:
    return Endpoint(server.grpc_url, "grpc", server.metrics_url, server.restricted_headers("grpc"))


def utterances(folder: Path) -> Path:
    """A jsonl of three utterances; the fake answers "<language> <WAV_LENS> <samples> <first sample>"."""
    lines = []
    for index, (seconds, first, text, language) in enumerate(
        [
            (0.1, 0.25, "en one thousand six hundred, 1600 0.25", None),  # the normaliser makes it exact
            (0.05, 0.5, "en 800 800 0.25", None),  # one substitution in 4 words
            (0.1, 0.125, "zh 1600 1600 0.125", "zh"),  # exact, scored per character
        ]
    ):
        write_wav(folder / f"{index}.wav", tone(seconds, 16000, first), 16000)
        lines.append({"audio": f"{index}.wav", "text": text, "id": f"utt{index}", "language": language})
    path = folder / "asr.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.server
def test_offline_run_scores_each_transcript(whisper_server, tmp_path):
    rows = load_asr_input(utterances(tmp_path))
    load = LoadSettings(concurrency=(1, 2), num_requests=3, warmup=0, reuse_rows=True)
    result = asyncio.run(run_levels(ASRWorkload("whisper_bls", False), rows, endpoint(whisper_server), load))
    assert result.summary["family"] == "asr" and result.summary["stream"] is False
    for summary in result.summary["levels"]:
        assert summary["errors"] == 0 and summary["audio_seconds"] == pytest.approx(0.25)
        asr = summary["asr"]
        assert (asr["scored"], asr["languages"]) == (3, {"en": 2, "zh": 1})
        assert asr["wer_corpus"] == pytest.approx(1 / 8) and asr["wer_mean"] == pytest.approx(1 / 8)
        assert asr["cer_corpus"] == 0.0 and asr["chars"] == len("zh160016000125")  # "." is punctuation
        assert summary["rtf_aggregate"] == pytest.approx(summary["duration_s"] / 0.25)
    texts = {rec.row: rec.text for rec in result.records}
    assert texts == {0: "en 1600 1600 0.25", 1: "en 800 800 0.5", 2: "zh 1600 1600 0.125"}
    second = next(rec for rec in result.records if rec.row == 1)
    assert second.accuracy["reference_normalized"] == "en 800 800 0.25"
    assert (second.accuracy["substitutions"], second.accuracy["rate"]) == (1, 0.25)


@pytest.mark.server
def test_streamed_partials_give_the_first_partial_latency(whisper_server, tmp_path):
    rows = load_asr_input(utterances(tmp_path))
    load = LoadSettings(concurrency=(2,), num_requests=3, warmup=0)
    result = asyncio.run(run_levels(ASRWorkload("whisper_stream", True), rows, endpoint(whisper_server), load))
    summary = result.summary["levels"][0]
    assert result.summary["stream"] is True and summary["errors"] == 0
    for rec in result.records:
        assert len(rec.chunk_ns) == 4  # the empty first response is no partial
        assert rec.send_ns < rec.chunk_ns[0] < rec.chunk_ns[-1] <= rec.end_ns
    assert summary["first_partial_ms"]["count"] == 3
    assert summary["first_partial_ms"]["max"] <= summary["e2e_ms"]["max"]
    assert summary["asr"]["wer_corpus"] == pytest.approx(1 / 8)  # the last partial is the transcript


@pytest.mark.server
def test_exact_lengths_reach_the_model(whisper_server, tmp_path):
    rows = load_asr_input(utterances(tmp_path))[:1]
    load = LoadSettings(concurrency=(1,), num_requests=1, warmup=0)
    options = RequestOptions(max_tokens=6, ignore_eos=True)
    workload = ASRWorkload("whisper_bls", False)
    result = asyncio.run(run_levels(workload, rows, endpoint(whisper_server), load, options=options))
    assert result.records[0].text == "en 1600 1600 0.25 la la"
    with pytest.raises(UsageError, match="'whisper_official' takes no MAX_NEW_TOKENS"):
        asyncio.run(run_levels(workload.retarget("whisper_official"), rows, endpoint(whisper_server), load,
                               options=options))  # fmt: skip
