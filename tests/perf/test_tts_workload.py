"""The TTS workload: input files (jsonl, seed-tts-eval folders), datasets, synthetic rows, requests and results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trtdeploy.errors import NotFoundError, UsageError
from trtdeploy.perf.report import write_wav
from trtdeploy.perf.tts import TTSWorkload, load_tts_file, read_audio
from trtdeploy.perf.workload import Chunk, InputRow, ModelInfo, RequestOptions, TensorSpec


def tts_model(*optional: str) -> ModelInfo:
    inputs = {
        "reference_wav": TensorSpec("reference_wav", "FP32", (-1,)),
        "reference_wav_len": TensorSpec("reference_wav_len", "INT32", (1,)),
        "reference_text": TensorSpec("reference_text", "BYTES", (1,)),
        "target_text": TensorSpec("target_text", "BYTES", (1,)),
    }
    kinds = {"sample_rate": "INT32", "max_tokens": "INT32", "temperature": "FP32", "top_k": "INT32"}
    kinds |= {"top_p": "FP32", "random_seed": "UINT64"}
    inputs |= {name: TensorSpec(name, kinds[name], (1,), optional=True) for name in optional}
    outputs = {"waveform": TensorSpec("waveform", "FP32", (-1,))}
    return ModelInfo("spark_tts", inputs, outputs, max_batch_size=4, decoupled=True)


def tone(seconds: float, rate: int) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * 220 * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def test_jsonl_rows_read_audio_relative_to_the_file(tmp_path: Path) -> None:
    write_wav(tmp_path / "wavs" / "a.wav", tone(1.0, 22050), 22050)
    lines = [
        {"id": "a", "reference_audio": "wavs/a.wav", "reference_text": "hello", "target_text": "good day"},
        {"prompt_audio": str(tmp_path / "wavs" / "a.wav"), "prompt_text": "hi", "target_text": "bye", "max_tokens": 9},
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    rows = load_tts_file(tmp_path / "in.jsonl")
    assert [row.input for row in rows] == ["good day", "bye"]
    assert rows[0].fields["id"] == "a" and rows[0].fields["sample_rate"] == 22050
    assert rows[0].fields["samples"].size == 22050
    assert rows[1].max_tokens == 9 and rows[1].reference == "bye"


def test_seed_tts_eval_folder(tmp_path: Path) -> None:
    write_wav(tmp_path / "prompt-wavs" / "u1.wav", tone(0.5, 16000), 16000)
    (tmp_path / "meta.lst").write_text("u1|参考文本|prompt-wavs/u1.wav|目标文本\n")
    (row,) = load_tts_file(tmp_path)
    assert row.input == "目标文本" and row.fields["reference_text"] == "参考文本" and row.fields["id"] == "u1"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"reference_text": "a", "target_text": "b"}', "no reference audio"),
        ('{"reference_audio": "missing.wav", "reference_text": "a", "target_text": "b"}', "does not exist"),
        ("[1, 2]", "expected a JSON object"),
        ("{oops", "not valid JSON"),
    ],
)
def test_bad_jsonl_rows_name_the_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(content + "\n")
    with pytest.raises((UsageError, NotFoundError), match=message) as info:
        load_tts_file(path)
    assert f"{path}:1" in str(info.value)


def test_bad_meta_line_and_missing_folder(tmp_path: Path) -> None:
    (tmp_path / "meta.lst").write_text("only|three|fields\n")
    with pytest.raises(UsageError, match=r"meta.lst:1: expected id\|reference text"):
        load_tts_file(tmp_path)
    with pytest.raises(NotFoundError, match="does not exist"):
        load_tts_file(tmp_path / "nowhere")


def test_unreadable_audio_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bad.wav").write_bytes(b"not a wav at all")
    with pytest.raises(UsageError, match="cannot read the reference audio"):
        read_audio("bad.wav", base=tmp_path, where="x")


def test_requests_resample_to_16k_and_send_the_declared_options() -> None:
    workload = TTSWorkload("spark_tts", decoupled=True, sample_rate=16000, tokens_per_second=50)
    model = tts_model("sample_rate", "max_tokens", "temperature", "random_seed")
    row = InputRow(
        input="target",
        reference="target",
        max_tokens=40,
        fields={"id": "r1", "reference_text": "ref", "samples": tone(1.0, 24000), "sample_rate": 24000},
    )
    options = RequestOptions(temperature=0.5, top_k=10, seed=3)
    with pytest.raises(UsageError, match="has no input 'top_k'"):
        workload.validate(model, options)
    options = RequestOptions(temperature=0.5, top_p=0.9, seed=3)
    with pytest.raises(UsageError, match="has no input 'top_p'"):
        workload.validate(model, options)
    # --temperature alone samples the whole distribution: top_p 1.0 is sent too (RequestOptions)
    model = tts_model("sample_rate", "max_tokens", "temperature", "random_seed", "top_p")
    options = RequestOptions(temperature=0.5, seed=3)
    workload.validate(model, options)
    request = workload.make_request(row, options, model)
    wav = request.inputs["reference_wav"]
    assert wav.shape == (1, 16000) and wav.dtype == np.float32
    assert request.inputs["reference_wav_len"].tolist() == [[16000]]
    assert request.inputs["sample_rate"].tolist() == [[16000]]
    assert request.inputs["max_tokens"].tolist() == [[40]]
    assert request.inputs["random_seed"].dtype == np.uint64
    assert request.inputs["top_p"].tolist() == [[1.0]]
    assert request.inputs["target_text"].tolist() == [[b"target"]]
    assert request.label == "r1" and request.outputs == ("waveform",)
    assert request.input_characters == len("target")  # the text spoken: characters per second in the summary


def test_chunks_are_audio_and_a_request_without_audio_fails() -> None:
    workload = TTSWorkload("spark_tts", decoupled=True, sample_rate=16000, tokens_per_second=50)
    chunks = [workload.parse_chunk({"waveform": np.ones((1, n), np.float32)}, None) for n in (3200, 1600)]
    assert [chunk.audio_seconds for chunk in chunks] == [0.2, 0.1]
    assert not workload.parse_chunk({"waveform": np.zeros((1, 0), np.float32)}, None).has_content
    result = workload.finish(None, chunks)
    assert result.audio.size == 4800 and result.audio_seconds == pytest.approx(0.3) and result.sample_rate == 16000
    with pytest.raises(ValueError, match="no audio"):
        workload.finish(None, [Chunk()][:0])


def test_overlapping_chunks_are_rebuilt_by_the_official_rule() -> None:
    """Each chunk after the first repeats the last 0.1 s of the one before; the audio is what the server finished."""
    finished = np.random.default_rng(0).standard_normal(16000).astype(np.float32)
    cuts = [0, 4800, 9600, 16000]
    wire = [finished[max(start - 1600, 0) : end] for start, end in zip(cuts, cuts[1:], strict=False)]
    workload = TTSWorkload(
        "spark_tts", decoupled=True, sample_rate=16000, tokens_per_second=50, chunk_overlap_samples=1600
    )
    chunks = [workload.parse_chunk({"waveform": chunk.reshape(1, -1)}, None) for chunk in wire]
    # a chunk's last 0.1 s plays once the next one is blended in
    assert [chunk.audio_seconds for chunk in chunks] == pytest.approx([0.2, 0.3, 0.4])
    result = workload.finish(None, chunks)
    assert result.audio_seconds == pytest.approx(1.0)
    assert np.abs(result.audio - finished).max() < 1e-6 * np.abs(finished).max()


def test_synthetic_rows_are_reproducible_and_sized_like_the_real_split() -> None:
    workload = TTSWorkload("spark_tts", decoupled=False, sample_rate=16000, tokens_per_second=50)
    rows = workload.synthetic_rows(26, input_tokens=128, output_tokens=None, seed=7)
    again = workload.synthetic_rows(26, input_tokens=128, output_tokens=None, seed=7)
    assert [row.input for row in rows] == [row.input for row in again]
    assert np.array_equal(rows[3].fields["samples"], again[3].fields["samples"])
    seconds = np.array([row.max_tokens for row in rows]) / 50
    assert 3 <= seconds.min() and seconds.max() <= 10 and 5 < seconds.mean() < 8
    assert all(np.abs(row.fields["samples"]).max() <= 0.31 for row in rows)
    capped = workload.synthetic_rows(2, input_tokens=128, output_tokens=77, seed=7)
    assert [row.max_tokens for row in capped] == [77, 77]


def test_local_dataset_with_seed_tts_columns(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    write_wav(tmp_path / "a.wav", tone(0.25, 16000), 16000)
    record = {"id": "x1", "prompt_text": "p", "prompt_audio": str(tmp_path / "a.wav"), "target_text": "t"}
    (tmp_path / "data.jsonl").write_text(json.dumps(record) + "\n")
    workload = TTSWorkload("spark_tts", decoupled=False, sample_rate=16000, tokens_per_second=50)
    (row,) = workload.load_dataset(str(tmp_path / "data.jsonl"), split=None, column=None, reference_column=None)
    assert row.input == "t" and row.fields["samples"].size == 4000
    with pytest.raises(UsageError, match="--reference-column does not apply"):
        workload.load_dataset(str(tmp_path / "data.jsonl"), split=None, column=None, reference_column="x")
