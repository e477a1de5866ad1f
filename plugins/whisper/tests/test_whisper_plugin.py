"""whisper: the random checkpoint, the checkpoint checks, options and limits, the text and audio of a request, and
the rendered model repository (no server)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2
from trtdeploy_whisper.audio import SAMPLE_RATE, AudioError, LogMel, utterances, windows
from trtdeploy_whisper.checkpoint import write_random_checkpoint
from trtdeploy_whisper.tokens import PromptError, WhisperText

from trtdeploy import UsageError
from trtdeploy.build import BuildRequest, plan, render_repository
from trtdeploy.plugins import get_model
from trtdeploy.repo import validate_config

ENGLISH = (
    "The children played in the park until the sun went down.",
    "Please speak clearly, and call me back at nine!",
    "A quick test of words it never saw: zebra, quasar, 2048.",
)
#: Whisper's ids of the 99-language (large-v2) and 100-language (large-v3) vocabularies.
V2_IDS = {
    "<|endoftext|>": 50257, "<|startoftranscript|>": 50258, "<|en|>": 50259, "<|zh|>": 50260, "<|su|>": 50357,
    "<|translate|>": 50358, "<|transcribe|>": 50359, "<|startoflm|>": 50360, "<|startofprev|>": 50361,
    "<|nocaptions|>": 50362, "<|notimestamps|>": 50363, "<|0.00|>": 50364, "<|30.00|>": 51864,
}  # fmt: skip
V3_IDS = {
    "<|endoftext|>": 50257, "<|startoftranscript|>": 50258, "<|en|>": 50259, "<|yue|>": 50358,
    "<|translate|>": 50359, "<|transcribe|>": 50360, "<|startoflm|>": 50361, "<|startofprev|>": 50362,
    "<|nospeech|>": 50363, "<|notimestamps|>": 50364, "<|0.00|>": 50365, "<|30.00|>": 51865,
}  # fmt: skip


@pytest.fixture(scope="module")
def spec():
    return get_model("whisper")


@pytest.fixture(scope="module")
def checkpoint(trtdeploy_checkpoint):
    return trtdeploy_checkpoint("whisper")


@pytest.fixture(scope="module")
def checkpoint_128(tmp_path_factory):
    dest = tmp_path_factory.mktemp("whisper-128") / "random"
    write_random_checkpoint(dest, n_mels=128)
    return dest


@pytest.mark.parametrize(("n_mels", "ids"), [(80, V2_IDS), (128, V3_IDS)])
def test_the_random_checkpoint_loads_with_transformers_in_whispers_layout(
    spec, checkpoint, checkpoint_128, n_mels, ids
):
    from transformers import AutoTokenizer, WhisperFeatureExtractor, WhisperForConditionalGeneration

    folder = checkpoint if n_mels == 80 else checkpoint_128
    spec.validate_checkpoint(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert type(tokenizer).__name__ == "WhisperTokenizer"
    assert len(tokenizer) == max(ids.values()) + 1
    assert tokenizer.convert_tokens_to_ids(list(ids)) == list(ids.values())
    for sentence in ENGLISH:
        encoded = tokenizer(sentence, add_special_tokens=False).input_ids
        assert max(encoded) < 50257 and len(encoded) < len(sentence.encode())  # merges learnt: fewer than bytes
        assert tokenizer.decode(encoded) == sentence
    # the published tokenizer.json's post-processor: the default prompt before the text, the end after it
    assert tokenizer("hello").input_ids[:2] == [ids["<|startoftranscript|>"], ids["<|notimestamps|>"]]
    assert tokenizer("hello").input_ids[-1] == ids["<|endoftext|>"]
    model = WhisperForConditionalGeneration.from_pretrained(str(folder), local_files_only=True)
    assert model.config.num_mel_bins == n_mels and model.config.vocab_size == len(tokenizer)
    assert model.generation_config.decoder_start_token_id == ids["<|startoftranscript|>"]
    assert WhisperFeatureExtractor.from_pretrained(str(folder)).feature_size == n_mels


def test_the_random_checkpoint_is_the_same_for_the_same_seed(checkpoint, tmp_path):
    write_random_checkpoint(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (checkpoint / name).read_bytes(), name


def _edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda folder: (folder / "tokenizer.json").unlink(), "missing tokenizer.json"),
        (lambda folder: (folder / "preprocessor_config.json").unlink(), "missing preprocessor_config.json"),
        (lambda folder: (folder / "model.safetensors").unlink(), "holds no \\*.safetensors"),
        (
            lambda folder: _edit_json(folder / "config.json", architectures=["Qwen2ForCausalLM"]),
            "is a Qwen2ForCausalLM, not a WhisperForConditionalGeneration",
        ),
        (
            lambda folder: _edit_json(folder / "preprocessor_config.json", feature_size=128),
            "makes 128 mel bins and the model takes 80",
        ),
        (lambda folder: (folder / "config.json").write_text("{"), "config.json is unreadable"),
    ],
)
def test_checkpoints_that_are_not_whisper_are_named(spec, checkpoint, tmp_path, breakage, message):
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    breakage(broken)
    with pytest.raises(UsageError, match=message):
        spec.validate_checkpoint(broken)


# --- the text of a request --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text(checkpoint):
    return WhisperText(checkpoint / "tokenizer.json")


def test_an_empty_prefix_is_the_english_transcription_prompt(text):
    assert text.prompt_ids("").tolist() == [50258, 50259, 50359, 50363]
    assert text.prompt_ids("  ").tolist() == [50258, 50259, 50359, 50363]
    assert len(text.languages) == 99 and text.languages[:3] == ["en", "zh", "de"]


def test_a_prefix_names_the_language_task_and_a_text_prompt(text):
    french = text.prompt_ids("<|startoftranscript|><|fr|><|translate|><|notimestamps|>").tolist()
    assert french == [50258, 50265, 50358, 50363]
    prompt = "<|startofprev|> Triton hotwords<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"
    prompted = text.prompt_ids(prompt)
    assert prompted[0] == 50361 and prompted[-4:].tolist() == [50258, 50259, 50359, 50363]
    assert text.tokenizer.decode(prompted[1:-4].tolist()) == " Triton hotwords"


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("<|startoftranscript|><|xx|><|transcribe|><|notimestamps|>", "names <\\|xx\\|>, which is not a token"),
        ("<|en|><|transcribe|>", "has no <\\|startoftranscript\\|>"),
    ],
)
def test_a_prefix_the_model_cannot_take_is_named(text, prefix, message):
    with pytest.raises(PromptError, match=message):
        text.prompt_ids(prefix)


def test_the_transcript_drops_every_special_token_and_strips(text):
    words = text.tokenizer.encode(" Hello there.", add_special_tokens=False).ids
    ids = [50258, 50364, *words, 50370, 50257, 50257]  # a prompt token, timestamps, the end token
    assert text.transcript(ids) == "Hello there."
    assert text.transcript([]) == ""


def test_a_default_language_the_model_lacks_is_refused(checkpoint):
    with pytest.raises(PromptError, match="'xx' is not one of this model's 99 languages"):
        WhisperText(checkpoint / "tokenizer.json", language="xx")


# --- the audio of a request -------------------------------------------------------------------------------------


def test_rows_are_cut_to_their_lengths_and_checked():
    wav = np.ones((2, 100), dtype=np.float32)
    rows = utterances(wav, np.array([[100], [40]], dtype=np.int32), max_samples=1000)
    assert [row.size for row in rows] == [100, 40]
    assert [row.size for row in utterances(wav, None, max_samples=1000)] == [100, 100]


@pytest.mark.parametrize(
    ("lengths", "nan", "max_samples", "message"),
    [
        ([[0]], False, 1000, "the audio is empty"),
        ([[101]], False, 1000, "WAV_LENS 101 is more than the 100 samples"),
        ([[100]], True, 1000, "NaN or infinite"),
        ([[100]], False, 80, "more than this deployment's max_audio_seconds"),
        ([[10], [10]], False, 1000, "WAV_LENS has 2 values for 1 rows"),
    ],
)
def test_audio_the_model_cannot_take_is_named(lengths, nan, max_samples, message):
    wav = np.ones((1, 100), dtype=np.float32)
    if nan:
        wav[0, 50] = np.nan
    with pytest.raises(AudioError, match=message):
        utterances(wav, np.array(lengths, dtype=np.int32), max_samples)


def test_long_audio_is_cut_into_consecutive_windows():
    samples = np.arange(70 * SAMPLE_RATE, dtype=np.float32)
    parts = windows(samples, 30 * SAMPLE_RATE)
    assert [part.size / SAMPLE_RATE for part in parts] == [30, 30, 10]
    assert np.array_equal(np.concatenate(parts), samples)


def test_features_are_the_feature_extractors_in_the_llms_type(checkpoint):
    from transformers import WhisperFeatureExtractor

    window = np.random.default_rng(0).uniform(-0.3, 0.3, 5 * SAMPLE_RATE).astype(np.float32)
    expected = WhisperFeatureExtractor.from_pretrained(str(checkpoint))(window, sampling_rate=SAMPLE_RATE)
    features = LogMel(checkpoint, "TYPE_FP16")(window)
    assert features.shape == (1, 3000, 80) and features.dtype == np.float16
    assert np.allclose(features[0].T, expected.input_features[0], atol=2e-3)
    assert LogMel(checkpoint, "TYPE_FP32")(window).dtype == np.float32


# --- options, limits and the rendered repository -----------------------------------------------------------------


def request(checkpoint, **kwargs) -> BuildRequest:
    return BuildRequest(model="whisper", model_dir=checkpoint, gpu="cpu", **kwargs)


@pytest.mark.parametrize(
    ("options", "kwargs", "message"),
    [
        ({}, {"max_input_len": 300, "max_output_len": 200}, "the 448 positions of Whisper's decoder"),
        ({"max_new_tokens": "300"}, {}, "max_new_tokens=300 is more than --max-output-len 224"),
        ({"window_seconds": "40"}, {}, "window_seconds=40.0 is out of range"),
        ({"task": "summarize"}, {}, "task=summarize is out of range"),
        ({"stream_first_tokens": "0"}, {}, "stream_first_tokens=0 is out of range"),
        ({"stream_growth": "0.5"}, {}, "stream_growth=0.5 is out of range"),
        ({"language": "xx"}, {}, "language=xx is not one of this model's 99 languages"),
        ({"beam": "4"}, {}, "unknown option 'beam'"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(checkpoint, tmp_path, options, kwargs, message):
    with pytest.raises(UsageError, match=message):
        plan(request(checkpoint, options=options, output_root=tmp_path, **kwargs))
    assert not any(tmp_path.iterdir())


def test_the_limits_follow_the_checkpoints_decoder_positions(checkpoint, tmp_path):
    other = tmp_path / "short"
    shutil.copytree(checkpoint, other)
    _edit_json(other / "config.json", max_target_positions=256)
    with pytest.raises(UsageError, match="= 448 is more than the 256 positions of Whisper's decoder"):
        plan(request(other, output_root=tmp_path / "out"))
    assert plan(request(other, output_root=tmp_path / "out", max_input_len=128, max_output_len=128))


@pytest.mark.parametrize("mode", ["streaming", "offline"])
def test_rendered_configs_parse_and_carry_the_settings(checkpoint, tmp_path, mode):
    found = plan(
        request(checkpoint, mode=mode, output_root=tmp_path, max_output_len=100, options={"language": "de"}),
        dry_run=True,
    )
    configs = render_repository(found.templates, tmp_path / "repo")
    entries = ["whisper_bls", "whisper_bls_offline", "whisper"] if mode == "streaming" else ["whisper_bls", "whisper"]
    llm = validate_config(configs["tensorrt_llm"])
    llm_features = next(tensor for tensor in llm.input if tensor.name == "encoder_input_features")
    llm_features_type = model_config_pb2.DataType.Name(llm_features.data_type)
    # streaming asks the LLM in segments: it is never decoupled, and takes the prompt plus the window's tokens so far
    assert not llm.model_transaction_policy.decoupled
    llm_parameters = {key: value.string_value for key, value in llm.parameters.items()}
    assert llm_parameters["max_input_len"] == str(found.point.max_input_len + 100) == llm_parameters["max_seq_len"]
    assert sorted(configs) == sorted([*entries, "tensorrt_llm"])
    for name in entries:
        config = validate_config(configs[name], expected_name=name)
        decoupled = name == "whisper_bls" and mode == "streaming"
        assert config.model_transaction_policy.decoupled == decoupled
        assert config.HasField("dynamic_batching") != decoupled
        assert [tensor.name for tensor in config.input] == [
            "TEXT_PREFIX", "WAV", "WAV_LENS", "SAMPLE_RATE", "MAX_NEW_TOKENS", "IGNORE_EOS"
        ]  # fmt: skip
        assert [tensor.name for tensor in config.output] == ["TRANSCRIPTS"]
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        assert parameters["max_new_tokens"] == "100" and parameters["language"] == "de"
        assert (parameters["stream_first_tokens"], parameters["stream_growth"]) == ("8", "4.0")
        # Triton-ASR-Client's name for the offline entry gets one instance (its dynamic batches serve the rest)
        assert config.instance_group[0].count == (1 if name == "whisper" else found.point.max_batch_size)
        # the features go out in the type the LLM model declares (fp32 for the torch engine on the CPU)
        assert parameters["encoder_features_dtype"] == llm_features_type == "TYPE_FP32"
    notes = " ".join(found.notes)
    assert "the official BLS asks for 50" in notes and "silently drops the rest" in notes
    assert ("streams the transcript so far" in notes) == (mode == "streaming")
    assert ("in segments of 8, then 4 times more each" in notes) == (mode == "streaming")
