"""The two registered models: their settings, the checkpoint they accept, the models a deployment holds."""

from dataclasses import replace

import pytest

from trtdeploy import UsageError, build
from trtdeploy.plugins import get_model


@pytest.mark.parametrize(
    ("option", "value"),
    [("first_chunk_tokens", "3"), ("flow_precision", "fp8"), ("max_reference_seconds", "31"), ("top_p", "1.5")],
)
def test_settings_out_of_range_are_refused_naming_the_option(option, value):
    with pytest.raises(UsageError, match=f"-o {option}={value}"):
        get_model("cosyvoice2").parse_options({option: value})


def test_a_checkpoint_of_the_other_generation_is_refused_with_the_right_command(cosyvoice_checkpoint):
    get_model("cosyvoice3").validate_checkpoint(cosyvoice_checkpoint("cosyvoice3"))
    with pytest.raises(UsageError, match="is a cosyvoice3 checkpoint, not cosyvoice2"):
        get_model("cosyvoice2").validate_checkpoint(cosyvoice_checkpoint("cosyvoice3"))


def test_cosyvoice3_adds_its_vocoder_and_streaming_adds_the_offline_entry():
    assert get_model("cosyvoice2").triton_models("offline") == (
        "audio_tokenizer", "speaker_embedding", "reference_voice", "token2wav", "cosyvoice2",
    )  # fmt: skip
    assert get_model("cosyvoice3").triton_models("streaming") == (
        "audio_tokenizer", "speaker_embedding", "reference_voice", "token2wav", "cosyvoice3", "vocoder",
        "cosyvoice3_offline",
    )  # fmt: skip


def test_a_streaming_deployment_sizes_its_offline_entry_apart(cosyvoice_checkpoint, tmp_path):
    request = build.BuildRequest(
        model="cosyvoice2",
        model_dir=cosyvoice_checkpoint("cosyvoice2"),
        gpu="cpu",
        mode="streaming",
        output_root=tmp_path / "deployments",
        options={"bls_instances": "6", "offline_instances": "2"},
    )
    configs = build.render_repository(build.plan(request, dry_run=True).templates, tmp_path / "repo")
    assert "count: 6 kind: KIND_CPU" in configs["cosyvoice2"].read_text()
    assert "count: 2 kind: KIND_CPU" in configs["cosyvoice2_offline"].read_text()
    unset = build.plan(replace(request, options={"bls_instances": "6"}), dry_run=True)
    configs = build.render_repository(unset.templates, tmp_path / "repo-default")
    assert "count: 6 kind: KIND_CPU" in configs["cosyvoice2_offline"].read_text()
