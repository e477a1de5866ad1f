"""Whisper on the trtllm engine: the plans per TensorRT-LLM release (golden files: the exact commands and the
rendered tensorrt_llm config), the assets step on a tiny random Hugging Face Whisper (openai-whisper's checkpoint
format, the mel filterbank, the tiktoken vocabulary), and the points and checkpoints it refuses. No TensorRT-LLM is
needed: plans read config.json only, and the assets step is plain torch."""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import WhisperConfig, WhisperForConditionalGeneration
from transformers.convert_slow_tokenizer import bytes_to_unicode

from trtdeploy import gpus
from trtdeploy.engines.trtllm import TrtllmEngine
from trtdeploy.engines.trtllm import whisper as trtllm_whisper
from trtdeploy.engines.trtllm_pytorch import TrtllmPytorchEngine
from trtdeploy.errors import UsageError
from trtdeploy.repo import TemplateSource, render_repository
from trtdeploy.spec import BuildContext, BuildPoint

from .trtllm_helpers import WHISPER_LARGE_V3, check_golden

#: The releases whose Whisper plans have golden files: examples/whisper/ without large-v3-turbo (0.17), and
#: examples/models/core/whisper/ with it (0.20, 1.2).
VERSIONS = ("0.17.0.post1", "0.20.0", "1.2.1")
#: large-v3-turbo differs from large-v3 in its 4 decoder layers.
LARGE_V3 = WHISPER_LARGE_V3
LARGE_V3_TURBO = {**LARGE_V3, "decoder_layers": 4}
#: Sizes of the tiny random model (the real vocabulary size: 80 mel bins, 99 languages).
TINY = {
    "num_mel_bins": 80,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 256,
    "decoder_ffn_dim": 256,
    "vocab_size": 51865,
    "max_source_positions": 1500,
    "max_target_positions": 448,
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]


def byte_level_tokenizer() -> Tokenizer:
    """A byte-level BPE over the 256 byte symbols, a few merges and Whisper's first special tokens."""
    symbols = list(bytes_to_unicode().values())
    vocab = {symbol: rank for rank, symbol in enumerate(symbols)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ã", "©")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory) -> Path:
    """A tiny random WhisperForConditionalGeneration in the Hugging Face layout, with a byte-level tokenizer.json."""
    folder = tmp_path_factory.mktemp("whisper") / "checkpoint"
    torch.manual_seed(0)
    WhisperForConditionalGeneration(WhisperConfig(**TINY)).save_pretrained(folder)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


def sized_like(checkpoint: Path, dest: Path, sizes: dict) -> Path:
    """A checkpoint folder whose config.json has ``sizes`` (plans read nothing else)."""
    dest.mkdir(parents=True)
    config = {**json.loads((checkpoint / "config.json").read_text()), **sizes}
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def context(checkpoint: Path, root: Path, version: str, *, engine: str = "trtllm", **changes) -> BuildContext:
    """The build context build.py gives an engine for the whisper plugin (encoder-decoder, the whole checkpoint is
    the LLM), on one H100 unless told otherwise."""
    selection = gpus.resolve(changes.pop("gpu", "H100"))
    settings = {"precision": "fp16", "max_batch_size": 64, "mode": "offline", "max_input_len": 16}
    settings.update(changes)
    settings.setdefault("max_output_len", 448 - settings["max_input_len"])
    point = BuildPoint(model="whisper", engine=engine, gpu=selection.label, engine_version=version, **settings)
    deployment = root / "whisper" / point.name
    return BuildContext(
        point=point,
        deployment_dir=deployment,
        checkpoint_dir=checkpoint,
        llm_dir=checkpoint,
        engine_dir=deployment / "engines",
        model_repo_dir=deployment / "model_repo",
        encoder_decoder=True,
        gpu_profile=selection.profile,
        gpu_count=selection.count,
    )


def plan_commands(ctx: BuildContext) -> str:
    engine = TrtllmEngine()
    engine.validate(ctx)
    lines = [shlex.join(step.argv) if step.argv else f"# {step.name}: {step.description}" for step in engine.steps(ctx)]
    return "\n".join(lines)


def render(ctx: BuildContext, dest: Path) -> str:
    """The tensorrt_llm config.pbtxt of this context, validated by Triton's protobuf (and for leftover ``${``)."""
    engine = TrtllmEngine()
    variables = {"ctx": ctx, "engine": engine.template_context(ctx), "model": {}}
    configs = render_repository([TemplateSource(engine.llm_templates(ctx), ("tensorrt_llm",), variables)], dest)
    text = configs["tensorrt_llm"].read_text()
    assert "${" not in text
    text = text.replace(str(ctx.deployment_dir), "<deployment>")
    return text.replace(f"TensorRT-LLM {ctx.point.engine_version}.", "TensorRT-LLM <release>.", 1)


@pytest.fixture(scope="module")
def real_sized(tiny_whisper, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sized")
    return {
        "large-v3": sized_like(tiny_whisper, root / "large-v3", LARGE_V3),
        "large-v3-turbo": sized_like(tiny_whisper, root / "large-v3-turbo", LARGE_V3_TURBO),
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_whisper_commands_per_release_and_precision(real_sized, tmp_path, version):
    sections = []
    for model, checkpoint in real_sized.items():
        for precision in trtllm_whisper.PRECISIONS:
            found = plan_commands(context(checkpoint, tmp_path, version, precision=precision))
            sections.append(f"## {model} {precision}\n{found.replace(str(checkpoint), '<checkpoint>')}\n")
    check_golden(f"whisper-commands-{version}.sh", "".join(sections))


@pytest.mark.parametrize("version", VERSIONS)
def test_whisper_tensorrt_llm_config_per_release(real_sized, tmp_path, version):
    ctx = context(real_sized["large-v3"], tmp_path, version, gpu="L4", max_batch_size=16)
    text = render(ctx, tmp_path / "repo")
    check_golden(f"whisper-config-{version}.pbtxt", text)


def test_the_config_names_both_engines_and_only_encoder_decoder_gets_a_cross_attention_cache(
    real_sized, tmp_path, qwen_checkpoint
):
    """Pitfall 1 of the official recipe: cross_kv_cache_fraction must be set for Whisper, and must not be for a
    decoder-only model."""
    ctx = context(real_sized["large-v3"], tmp_path, "1.2.1", max_batch_size=8)
    parameters = TrtllmEngine().template_context(ctx)["parameters"]
    assert parameters["gpt_model_path"] == ctx.engine_dir / "decoder"
    assert parameters["encoder_model_path"] == ctx.engine_dir / "encoder"
    # 8 requests of 448 decoder tokens and 1500 encoder outputs each; the cross cache's share of the memory
    assert parameters["max_tokens_in_paged_kv_cache"] == 8 * (448 + 1500)
    assert parameters["cross_kv_cache_fraction"] == round(1500 / (1500 + 448), 2)
    assert (parameters["enable_kv_cache_reuse"], parameters["enable_chunked_context"]) == ("false", "false")
    text = render(ctx, tmp_path / "repo")
    for name in ("encoder_input_features", "encoder_output_lengths", "decoder_input_ids", "input_lengths"):
        assert f'name: "{name}"' in text
    assert re.search(r'name: "encoder_input_features"\n  data_type: TYPE_FP16', text)
    decoder_only = replace(ctx, encoder_decoder=False, llm_dir=qwen_checkpoint)
    llm = TrtllmEngine().template_context(decoder_only)["parameters"]
    assert "cross_kv_cache_fraction" not in llm and "encoder_model_path" not in llm


def test_the_converter_name_follows_the_release_and_a_dry_run_without_config_plans_the_default(real_sized, tmp_path):
    turbo = real_sized["large-v3-turbo"]
    old = plan_commands(context(turbo, tmp_path, "0.17.0.post1"))
    new = plan_commands(context(turbo, tmp_path, "0.20.0"))
    assert "examples/whisper/convert_checkpoint.py --model_dir engines/assets --model_name large-v3 " in old
    assert (
        "examples/models/core/whisper/convert_checkpoint.py --model_dir engines/assets --model_name large-v3-turbo "
        in new
    )
    missing = tmp_path / "not-downloaded"
    assert "--model_name large-v3 " in plan_commands(context(missing, tmp_path, "1.2.1"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"precision": "bf16"}, "Whisper example builds fp16, int8_wo, int4_wo .*not bf16"),
        ({"precision": "fp8"}, "not fp8"),
        ({"max_input_len": 64, "max_output_len": 400}, "464 exceeds the decoder's 448 positions"),
        ({"tp": 2, "gpu": "H100:2"}, "writes one rank only"),
    ],
)
def test_whisper_points_the_engine_flow_cannot_build_are_refused(real_sized, tmp_path, changes, message):
    with pytest.raises(UsageError, match=message):
        TrtllmEngine().validate(context(real_sized["large-v3"], tmp_path, "1.2.1", **changes))


def test_an_encoder_decoder_that_is_not_whisper_is_refused(tmp_path):
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"architectures": ["T5ForConditionalGeneration"], "d_model": 512}))
    with pytest.raises(UsageError, match="from WhisperForConditionalGeneration checkpoints only.*T5ForConditional"):
        TrtllmEngine().validate(context(t5, tmp_path, "1.2.1"))


def test_a_whisper_the_openai_format_cannot_express_is_refused(tiny_whisper, tmp_path):
    odd = sized_like(tiny_whisper, tmp_path / "odd", {"encoder_ffn_dim": 200})
    with pytest.raises(UsageError, match="encoder_ffn_dim 200 is not 4 x d_model \\(256\\)"):
        TrtllmEngine().validate(context(odd, tmp_path, "0.17.0.post1"))


def test_trtllm_pytorch_refuses_whisper_with_the_engine_to_use(real_sized, tmp_path):
    ctx = context(real_sized["large-v3"], tmp_path, "1.2.1", engine="trtllm_pytorch", precision="bf16")
    with pytest.raises(UsageError, match="1.0-1.2.x has no Whisper model .*pull request 16141") as refused:
        TrtllmPytorchEngine().validate(ctx)
    assert "--engine trtllm" in refused.value.hint and "--engine torch" in refused.value.hint


def openai_parameters(dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """openai-whisper's state dict (whisper/model.py: AudioEncoder, TextDecoder, ResidualAttentionBlock with a key
    projection without bias), names and shapes, from its ModelDimensions."""
    shapes: dict[str, tuple[int, ...]] = {}

    def block(prefix: str, width: int, cross: bool) -> None:
        for attention in ("attn", "cross_attn") if cross else ("attn",):
            for projection in ("query", "key", "value", "out"):
                shapes[f"{prefix}.{attention}.{projection}.weight"] = (width, width)
                if projection != "key":
                    shapes[f"{prefix}.{attention}.{projection}.bias"] = (width,)
            shapes[f"{prefix}.{attention}_ln.weight"] = shapes[f"{prefix}.{attention}_ln.bias"] = (width,)
        shapes[f"{prefix}.mlp.0.weight"], shapes[f"{prefix}.mlp.0.bias"] = (4 * width, width), (4 * width,)
        shapes[f"{prefix}.mlp.2.weight"], shapes[f"{prefix}.mlp.2.bias"] = (width, 4 * width), (width,)
        shapes[f"{prefix}.mlp_ln.weight"] = shapes[f"{prefix}.mlp_ln.bias"] = (width,)

    audio, text = dims["n_audio_state"], dims["n_text_state"]
    shapes["encoder.conv1.weight"], shapes["encoder.conv1.bias"] = (audio, dims["n_mels"], 3), (audio,)
    shapes["encoder.conv2.weight"], shapes["encoder.conv2.bias"] = (audio, audio, 3), (audio,)
    shapes["encoder.positional_embedding"] = (dims["n_audio_ctx"], audio)
    for layer in range(dims["n_audio_layer"]):
        block(f"encoder.blocks.{layer}", audio, cross=False)
    shapes["encoder.ln_post.weight"] = shapes["encoder.ln_post.bias"] = (audio,)
    shapes["decoder.token_embedding.weight"] = (dims["n_vocab"], text)
    shapes["decoder.positional_embedding"] = (dims["n_text_ctx"], text)
    for layer in range(dims["n_text_layer"]):
        block(f"decoder.blocks.{layer}", text, cross=True)
    shapes["decoder.ln.weight"] = shapes["decoder.ln.bias"] = (text,)
    return shapes


@pytest.fixture(scope="module")
def assets(tiny_whisper, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("deployment") / "assets"
    written = trtllm_whisper.write_assets(tiny_whisper, folder, "large-v2")
    assert sorted(path.name for path in written) == ["large-v2.pt", "mel_filters.npz", "multilingual.tiktoken"]
    return folder


def test_the_assets_step_writes_openai_whispers_checkpoint(tiny_whisper, assets):
    saved = torch.load(assets / "large-v2.pt", map_location="cpu", weights_only=True)
    assert set(saved) == {"dims", "model_state_dict"}
    assert saved["dims"] == {
        "n_mels": 80,
        "n_audio_ctx": 1500,
        "n_audio_state": 64,
        "n_audio_head": 4,
        "n_audio_layer": 2,
        "n_vocab": 51865,
        "n_text_ctx": 448,
        "n_text_state": 64,
        "n_text_head": 4,
        "n_text_layer": 2,
    }
    state = saved["model_state_dict"]
    expected = openai_parameters(saved["dims"])
    assert {name: tuple(tensor.shape) for name, tensor in state.items()} == expected
    assert {tensor.dtype for tensor in state.values()} == {torch.float16}
    hf = WhisperForConditionalGeneration.from_pretrained(tiny_whisper).state_dict()
    pairs = {
        "encoder.blocks.1.attn.key.weight": "model.encoder.layers.1.self_attn.k_proj.weight",
        "decoder.blocks.0.cross_attn.value.bias": "model.decoder.layers.0.encoder_attn.v_proj.bias",
        "decoder.blocks.1.cross_attn_ln.weight": "model.decoder.layers.1.encoder_attn_layer_norm.weight",
        "decoder.blocks.0.mlp.2.weight": "model.decoder.layers.0.fc2.weight",
        "encoder.ln_post.bias": "model.encoder.layer_norm.bias",
        "decoder.positional_embedding": "model.decoder.embed_positions.weight",
        "decoder.token_embedding.weight": "proj_out.weight",  # tied
    }
    for openai, hf_name in pairs.items():
        assert torch.equal(state[openai], hf[hf_name].to(torch.float16)), openai


def test_the_mel_filterbank_is_openai_whispers(assets):
    with np.load(assets / "mel_filters.npz") as saved:
        assert list(saved) == ["mel_80"]
        bank = saved["mel_80"]
    assert bank.shape == (80, 201) and bank.dtype == np.float32
    # values of openai/whisper@c0d2f62:whisper/assets/mel_filters.npz (librosa.filters.mel, sr 16000, n_fft 400)
    assert bank.astype(np.float64).sum() == pytest.approx(1.999024092387117, rel=1e-6)
    assert bank.max() == pytest.approx(0.025880683213472366, rel=1e-6)
    assert bank[40].astype(np.float64).sum() == pytest.approx(0.026664861012250185, rel=1e-6)
    large = trtllm_whisper.mel_filters(128)
    assert large.shape == (128, 201)
    assert large.astype(np.float64).sum() == pytest.approx(3.1909855409403463, rel=1e-6)
    assert large.max() == pytest.approx(0.04168175160884857, rel=1e-6)


def test_the_tiktoken_file_holds_every_regular_token_by_rank(tiny_whisper, assets):
    tokenizer = Tokenizer.from_file(str(tiny_whisper / "tokenizer.json"))
    special = {tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    lines = (assets / "multilingual.tiktoken").read_text().splitlines()
    ranks = [int(line.split(" ")[1]) for line in lines]
    assert ranks == sorted(set(range(tokenizer.get_vocab_size())) - special)
    for line in lines:
        encoded, rank = line.split(" ")
        data = base64.b64decode(encoded)
        assert data.decode("utf-8", errors="replace") == tokenizer.decode([int(rank)]), line
    assert f"{base64.b64encode(b' the').decode()} {tokenizer.token_to_id('Ġthe')}" in lines
    assert f"{base64.b64encode('é'.encode()).decode()} {tokenizer.token_to_id('Ã©')}" in lines
