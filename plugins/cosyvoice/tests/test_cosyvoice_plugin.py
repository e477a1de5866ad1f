"""The two registered models: their settings, the checkpoint they accept, the models a deployment holds."""

import pytest

from trtdeploy import UsageError
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
        "audio_tokenizer", "speaker_embedding", "token2wav", "cosyvoice2",
    )  # fmt: skip
    assert get_model("cosyvoice3").triton_models("streaming") == (
        "audio_tokenizer", "speaker_embedding", "token2wav", "cosyvoice3", "vocoder", "cosyvoice3_offline",
    )  # fmt: skip
