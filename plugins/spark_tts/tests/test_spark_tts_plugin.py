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
    streaming = plan(request(checkpoint, engine="torch", output_root=tmp_path))
    assert sorted(streaming.triton_models) == [
        "audio_tokenizer", "spark_tts", "spark_tts_offline", "tensorrt_llm", "vocoder"
    ]  # fmt: skip
    offline = plan(request(checkpoint, engine="torch", mode="offline", output_root=tmp_path))
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
        ({"chunk_overlap_seconds": "0.3"}, {}, "chunk_overlap_seconds=0.3 is out of range"),  # over half a chunk
        ({"stream_format": "wav"}, {}, "stream_format=wav is out of range"),
        ({"chunk_overlap_seconds": "0.05"}, {}, "chunk_overlap_seconds=0.05 is not a whole number of semantic tokens"),
        ({"chunk_overlap_seconds": "0"}, {}, "stream_format=overlapped needs chunk_overlap_seconds > 0"),
        ({"vocoder_lookahead_tokens": "-1"}, {}, "holds back 38 tokens, more than the first chunk of 25 tokens"),
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


def test_the_stream_format_and_the_seed_rule_reach_the_entry(trtdeploy_checkpoint, tmp_path):
    from trtdeploy.build import render_repository

    checkpoint = trtdeploy_checkpoint("spark_tts")
    expected = {
        # the torch engine's noise depends on (seed, position): one seed serves every segment
        "torch": ({"engine": "torch"}, "true"),
        # TensorRT-LLM restarts a seed's noise with every request: each segment gets its own seed
        "trtllm": ({"engine": "trtllm", "gpu": "L4", "engine_version": "1.2.1"}, "false"),
    }
    for name, (kwargs, keyed) in expected.items():
        found = plan(
            BuildRequest(
                model="spark_tts",
                model_dir=checkpoint,
                output_root=tmp_path / name,
                **{"gpu": "cpu", **kwargs},
                options={"stream_format": "finished"},
            ),
            dry_run=True,  # the trtllm engine plans anywhere
        )
        entry = render_repository(found.templates, tmp_path / name / "repo")["spark_tts"].read_text()
        assert f'key: "llm_noise_keyed_by_position" value: {{ string_value: "{keyed}" }}' in entry
        assert 'key: "stream_format" value: { string_value: "finished" }' in entry
        assert 'name: "stream_format" data_type: TYPE_STRING' in entry
        assert ("its own seed" in " ".join(found.notes)) == (keyed == "false")


def test_the_plan_says_which_end_token_is_used_when_config_and_tokenizer_disagree(trtdeploy_checkpoint, tmp_path):
    import json

    checkpoint = tmp_path / "Spark-TTS"
    shutil.copytree(trtdeploy_checkpoint("spark_tts"), checkpoint)
    agreed = plan(request(checkpoint, engine="torch", output_root=tmp_path / "a"))
    assert not any("end-of-sequence" in note or "ends on id" in note for note in agreed.notes)
    for name in ("config.json", "generation_config.json"):
        config_file = checkpoint / "LLM" / name
        config = json.loads(config_file.read_text())
        config["eos_token_id"] = 5
        config_file.write_text(json.dumps(config))
    found = plan(request(checkpoint, engine="torch", output_root=tmp_path / "b"))
    assert any(note.startswith("the LLM ends on id 5 (generation_config.json eos_token_id") for note in found.notes)
