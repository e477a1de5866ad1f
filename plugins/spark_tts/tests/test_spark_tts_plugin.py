"""spark_tts: the checkpoint layout, options, and the rendered model repository (no server)."""

from __future__ import annotations

import shutil

import pytest

from trtdeploy import UsageError
from trtdeploy.build import BuildRequest, plan
from trtdeploy.plugins import get_model


@pytest.fixture(scope="module")
def spec():
    return get_model("spark_tts")


def test_random_checkpoint_has_the_official_layout(spec, trtdeploy_checkpoint):
    checkpoint = trtdeploy_checkpoint("spark_tts")
    spec.validate_checkpoint(checkpoint)
    for name in ("config.yaml", "BiCodec/config.yaml", "BiCodec/model.safetensors", "LLM/tokenizer.json"):
        assert (checkpoint / name).is_file(), name


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("BiCodec/model.safetensors", "missing BiCodec/model.safetensors"),
        ("wav2vec2-large-xlsr-53", "missing wav2vec2-large-xlsr-53/config.json"),
        ("LLM/model.safetensors", "holds no \\*.safetensors"),
    ],
)
def test_incomplete_checkpoints_are_named(spec, trtdeploy_checkpoint, tmp_path, remove, message):
    broken = tmp_path / "broken"
    shutil.copytree(trtdeploy_checkpoint("spark_tts"), broken)
    target = broken / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(UsageError, match=message):
        spec.validate_checkpoint(broken)


def test_an_llm_without_spark_tokens_is_refused(spec, trtdeploy_checkpoint, tmp_path):
    from trtdeploy.checkpoints import write_bpe_tokenizer

    other = tmp_path / "other"
    shutil.copytree(trtdeploy_checkpoint("spark_tts"), other)
    write_bpe_tokenizer(other / "LLM")
    with pytest.raises(UsageError, match="has no Spark-TTS tokens"):
        spec.validate_checkpoint(other)


def request(checkpoint, **kwargs) -> BuildRequest:
    return BuildRequest(model="spark_tts", model_dir=checkpoint, gpu="cpu", **kwargs)


def test_streaming_renders_both_entries_offline_one(trtdeploy_checkpoint, tmp_path):
    checkpoint = trtdeploy_checkpoint("spark_tts")
    streaming = plan(request(checkpoint, output_root=tmp_path))
    assert streaming.engine.name == "torch"  # the best engine installed here
    assert sorted(streaming.triton_models) == [
        "audio_tokenizer", "spark_tts", "spark_tts_offline", "tensorrt_llm", "vocoder"
    ]  # fmt: skip
    offline = plan(request(checkpoint, mode="offline", output_root=tmp_path))
    assert "spark_tts_offline" not in offline.triton_models


def test_rendered_configs_carry_the_settings(trtdeploy_deploy):
    deployment = trtdeploy_deploy(
        "spark_tts", mode="streaming", max_input_len=1024, max_output_len=300, options={"top_k": "20"}
    )
    repo = deployment.model_repo
    entry = (repo / "spark_tts" / "config.pbtxt").read_text()
    offline = (repo / "spark_tts_offline" / "config.pbtxt").read_text()
    assert "decoupled: true" in entry and "decoupled: false" in offline
    # the BLS asks the LLM for segments (non-decoupled), whose prompts hold what was said so far
    llm = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "decoupled: false" in llm
    assert 'key: "max_input_len" value: { string_value: "1324" }' in llm
    assert 'name: "spark_tts_offline"' in offline
    for text in (entry, offline):
        assert 'key: "top_k" value: { string_value: "20" }' in text
        assert 'key: "max_new_tokens" value: { string_value: "300" }' in text
        # (1024 - 32 global - 256 for the texts) / 50 tokens per second
        assert 'key: "max_reference_seconds" value: { string_value: "14.72" }' in text


@pytest.mark.parametrize(
    ("options", "kwargs", "message"),
    [
        ({"top_p": "1.5"}, {}, "top_p=1.5 is out of range"),
        ({"chunk_overlap_seconds": "2"}, {}, "chunk_overlap_seconds=2.0 is out of range"),
        ({"max_new_tokens": "5000"}, {}, "max_new_tokens=5000 is more than --max-output-len 3000"),
        ({"max_reference_seconds": "60"}, {}, "max_reference_seconds=60 does not fit --max-input-len 2048"),
        ({}, {"max_input_len": 200}, "leaves no room for reference audio"),
        ({"speed": "fast"}, {}, "unknown option 'speed'"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(trtdeploy_checkpoint, tmp_path, options, kwargs, message):
    with pytest.raises(UsageError, match=message):
        plan(request(trtdeploy_checkpoint("spark_tts"), options=options, output_root=tmp_path, **kwargs))
    assert not any(tmp_path.iterdir())
