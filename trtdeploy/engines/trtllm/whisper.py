"""Whisper (encoder-decoder) on TensorRT-LLM's engine flow: what an expert runs by hand, for the release planned.

TensorRT-LLM's Whisper converter reads openai-whisper's own checkpoint format, not Hugging Face's: ``<model_dir>/
<model_name>.pt``, a torch dict of ``dims`` (openai's ``ModelDimensions``) and ``model_state_dict`` (openai's
parameter names). The assets step writes that file from the Hugging Face checkpoint, with the runtime assets beside
it (``mel_filters.npz``, ``multilingual.tiktoken``); ``convert_checkpoint.py`` then writes ``encoder/`` and
``decoder/``, and ``trtllm-build`` turns each into an engine.
"""

from __future__ import annotations

import base64
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import BuildError, UsageError
from ...memory import read_config
from ...spec import BuildContext
from ..base import BuildStep
from .commands import CHECKPOINT, ENGINES, WEIGHT_ONLY, examples_dir
from .versions import TrtllmVersion

ARCHITECTURE = "WhisperForConditionalGeneration"
#: Where the assets step writes the converter's input and the runtime assets of the official BLS, in the deployment
#: folder: inside engines/, so that a build that reuses the engines keeps them.
ASSETS = "engines/assets"
MEL_FILTERS = "mel_filters.npz"
TIKTOKEN = "multilingual.tiktoken"
#: The precisions of the Whisper example's support matrix (FP16, INT8 and INT4 weight-only): fp16 activations.
PRECISIONS = ("fp16", *WEIGHT_ONLY)
#: The audio front end every Whisper checkpoint shares (openai-whisper's audio.py): 16 kHz, 400-sample FFT.
SAMPLE_RATE = 16000
N_FFT = 400
#: The converter's default --model_name: in every release's list, and only ever a file name to it.
DEFAULT_NAME = "large-v3"
#: openai-whisper's released shapes -> their names: (n_mels, n_audio_layer, n_text_layer, n_audio_state).
OPENAI_SHAPES = {
    (128, 32, 32, 1280): "large-v3",
    (128, 32, 4, 1280): "large-v3-turbo",
    (80, 32, 32, 1280): "large-v2",
    (80, 24, 24, 1024): "medium",
    (80, 12, 12, 768): "small",
    (80, 6, 6, 512): "base",
    (80, 4, 4, 384): "tiny",
    (128, 32, 2, 1280): "distil-large-v3",
    (80, 32, 2, 1280): "distil-large-v2",
    (80, 24, 2, 1024): "distil-medium",
    (80, 12, 2, 768): "distil-small",
}
#: The vocabulary of the English-only checkpoints (``*.en``): one id fewer than the multilingual ones.
ENGLISH_ONLY_VOCAB = 51864


@dataclass(frozen=True)
class WhisperDims:
    """openai-whisper's ``ModelDimensions``, read from a Hugging Face ``WhisperConfig``."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> WhisperDims:
        return cls(
            n_mels=config["num_mel_bins"],
            n_audio_ctx=config["max_source_positions"],
            n_audio_state=config["d_model"],
            n_audio_head=config["encoder_attention_heads"],
            n_audio_layer=config["encoder_layers"],
            n_vocab=config["vocab_size"],
            n_text_ctx=config["max_target_positions"],
            n_text_state=config["d_model"],
            n_text_head=config["decoder_attention_heads"],
            n_text_layer=config["decoder_layers"],
        )

    @property
    def mel_frames(self) -> int:
        """The encoder's input length in mel frames (its conv2 halves it to n_audio_ctx): 3000 for 30 s."""
        return 2 * self.n_audio_ctx

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def read_dims(ctx: BuildContext) -> WhisperDims | None:
    """The checkpoint's dims, after refusing what is not a Whisper the converter can take (None: no config.json
    yet, a dry run before the download)."""
    config = read_config(ctx.llm_dir)
    if config is None:
        return None
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        found = ", ".join(architectures) or "no architecture"
        raise UsageError(
            f"the trtllm engine builds encoder-decoder models from {ARCHITECTURE} checkpoints only, and "
            f"{ctx.llm_dir} is {found}",
            hint="use --engine torch",
        )
    unexpressible = _unexpressible(config)
    if unexpressible:
        raise UsageError(
            f"{ctx.llm_dir}: {unexpressible}, which openai-whisper's checkpoint format (what TensorRT-LLM's Whisper "
            "converter reads) cannot express",
            hint="use --engine torch",
        )
    return WhisperDims.from_config(config)


def _unexpressible(config: dict[str, Any]) -> str | None:
    """What of this config openai's Whisper (fixed GELU MLPs of 4 x d_model, unscaled embeddings) has not."""
    width = config["d_model"]
    for key in ("encoder_ffn_dim", "decoder_ffn_dim"):
        if config.get(key, 4 * width) != 4 * width:
            return f"{key} {config[key]} is not 4 x d_model ({4 * width})"
    if config.get("activation_function", "gelu") != "gelu":
        return f"activation_function {config['activation_function']!r} is not gelu"
    if config.get("scale_embedding"):
        return "scale_embedding is set"
    if config.get("tie_word_embeddings") is False:
        return "its output projection is not tied to the token embedding"
    return None


def model_name(dims: WhisperDims | None, version: TrtllmVersion) -> str:
    """The ``--model_name`` (and ``.pt`` file name) to give this release's converter.

    The converter reads everything from the file's ``dims``: the name only picks the file, among the choices of the
    release's argument parser. A released shape gets its own name where the list has it, anything else the
    converter's default.
    """
    if dims is None:
        return DEFAULT_NAME
    name = OPENAI_SHAPES.get((dims.n_mels, dims.n_audio_layer, dims.n_text_layer, dims.n_audio_state))
    if name and dims.n_vocab == ENGLISH_ONLY_VOCAB:
        name = f"{name}.en"
    return name if name in version.facts.whisper_model_names else DEFAULT_NAME


def validate(ctx: BuildContext) -> WhisperDims | None:
    """Refuse a Whisper point the engine flow cannot build (precision, lengths, checkpoint)."""
    point = ctx.point
    if point.precision not in PRECISIONS:
        raise UsageError(
            f"TensorRT-LLM's Whisper example builds {', '.join(PRECISIONS)} (its support matrix), not "
            f"{point.precision}",
            hint="pass --precision fp16 (or int8_wo, int4_wo)",
        )
    if point.kv_cache_dtype:
        raise UsageError("--kv-cache-dtype: TensorRT-LLM's Whisper converter writes no quantized KV cache")
    if point.tp * point.pp > 1:
        raise UsageError("TensorRT-LLM's Whisper converter writes one rank only", hint="drop --tp/--pp")
    dims = read_dims(ctx)
    if dims is not None and point.max_seq_len > dims.n_text_ctx:
        raise UsageError(
            f"max_input_len + max_output_len = {point.max_seq_len} exceeds the decoder's {dims.n_text_ctx} "
            "positions (max_target_positions)",
            hint=f"keep --max-input-len plus --max-output-len at {dims.n_text_ctx} or less",
        )
    return dims


def encoder_frames(ctx: BuildContext) -> int:
    """The encoder's input length in mel frames (3000, 30 s of audio, where config.json is not here yet)."""
    config = read_config(ctx.llm_dir)
    return WhisperDims.from_config(config).mel_frames if config else 3000


def steps(ctx: BuildContext, version: TrtllmVersion) -> list[BuildStep]:
    """assets -> convert -> build the encoder -> build the decoder -> cleanup."""
    point = ctx.point
    name = model_name(read_dims(ctx), version)
    script = f"{examples_dir()}/{version.facts.examples_layout}whisper/convert_checkpoint.py"
    convert = ["python3", script, "--model_dir", ASSETS, "--model_name", name, "--output_dir", CHECKPOINT]
    convert += ["--dtype", "float16", "--logits_dtype", "float16"]
    if point.precision in WEIGHT_ONLY:
        convert += ["--use_weight_only", "--weight_only_precision", WEIGHT_ONLY[point.precision]]
    frames = str(encoder_frames(ctx))
    encoder = [
        "trtllm-build",
        "--checkpoint_dir", f"{CHECKPOINT}/encoder",
        "--output_dir", f"{ENGINES}/encoder",
        "--moe_plugin", "disable",
        "--max_batch_size", str(point.max_batch_size),
        "--gemm_plugin", "disable",
        "--bert_attention_plugin", "float16",
        "--max_input_len", frames,
        "--max_seq_len", frames,
    ]  # fmt: skip
    decoder = [
        "trtllm-build",
        "--checkpoint_dir", f"{CHECKPOINT}/decoder",
        "--output_dir", f"{ENGINES}/decoder",
        "--moe_plugin", "disable",
        "--max_beam_width", "1",
        "--max_batch_size", str(point.max_batch_size),
        "--max_input_len", str(ctx.llm_max_input_len),
        "--max_seq_len", str(point.max_seq_len),
        "--max_encoder_input_len", frames,
        "--gemm_plugin", "float16",
        "--bert_attention_plugin", "float16",
        "--gpt_attention_plugin", "float16",
    ]  # fmt: skip
    checkpoint_dir = ctx.llm_dir

    def write(log: Path) -> None:
        folder = log.parent.parent / ASSETS
        written = write_assets(checkpoint_dir, folder, name)
        log.write_text("".join(f"wrote {ASSETS}/{path.name}\n" for path in written))

    def remove(log: Path) -> None:
        shutil.rmtree(log.parent.parent / CHECKPOINT, ignore_errors=True)
        (log.parent.parent / ASSETS / f"{name}.pt").unlink(missing_ok=True)
        log.write_text(f"removed {CHECKPOINT}/ and {ASSETS}/{name}.pt\n")

    return [
        BuildStep(
            "assets",
            f"write {ASSETS}/{name}.pt (openai-whisper's format), {MEL_FILTERS} and {TIKTOKEN}",
            run=write,
        ),
        BuildStep(
            "convert", f"convert to a TRT-LLM checkpoint ({point.precision})", tuple(convert), requires=(script,)
        ),
        BuildStep("build_encoder", "build the encoder engine with trtllm-build", tuple(encoder)),
        BuildStep("build_decoder", "build the decoder engine with trtllm-build", tuple(decoder)),
        BuildStep("cleanup", f"remove {CHECKPOINT}/ and {ASSETS}/{name}.pt (the engines are built)", run=remove),
    ]


def cross_kv_cache_fraction(ctx: BuildContext) -> float:
    """The cross-attention share of the KV-cache memory: each request's cross cache holds the encoder's output
    (half its input frames), its self cache up to max_seq_len tokens, of the same size per token (both are the
    decoder's layers and heads), so this share gives both caches room for the same number of requests."""
    cross = encoder_frames(ctx) // 2
    return round(cross / (cross + ctx.point.max_seq_len), 2)


def kv_cache_tokens(ctx: BuildContext) -> int:
    """Tokens of self and cross attention for every request of the batch at full length."""
    return ctx.point.max_batch_size * (ctx.point.max_seq_len + encoder_frames(ctx) // 2)


# --- the assets step -------------------------------------------------------------------------------------------

#: Hugging Face's names -> openai-whisper's, per layer (``{part}``: ``encoder``/``decoder``; HF's
#: ``encoder_attn`` is openai's ``cross_attn``).
_LAYER_NAMES = {
    "self_attn.q_proj": "attn.query",
    "self_attn.k_proj": "attn.key",
    "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out",
    "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query",
    "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value",
    "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln",
    "fc1": "mlp.0",
    "fc2": "mlp.2",
    "final_layer_norm": "mlp_ln",
}
_TOP_NAMES = {
    "encoder.conv1": "encoder.conv1",
    "encoder.conv2": "encoder.conv2",
    "encoder.embed_positions": "encoder.positional_embedding",
    "encoder.layer_norm": "encoder.ln_post",
    "decoder.embed_tokens": "decoder.token_embedding",
    "decoder.embed_positions": "decoder.positional_embedding",
    "decoder.layer_norm": "decoder.ln",
}
#: Positional embeddings are bare tensors in openai's modules (a buffer, a parameter), not ``.weight``s.
_BARE = {"encoder.positional_embedding", "decoder.positional_embedding"}


def openai_name(hf_name: str) -> str | None:
    """openai-whisper's name for a Hugging Face Whisper parameter (None: the output projection, tied to the token
    embedding, which openai's format does not store)."""
    name = hf_name.removeprefix("model.")
    if name.startswith("proj_out."):
        return None
    module, _, leaf = name.rpartition(".")
    parts = module.split(".")
    if len(parts) > 3 and parts[1] == "layers":  # encoder.layers.3.self_attn.q_proj
        inner = ".".join(parts[3:])
        if inner in _LAYER_NAMES:
            return f"{parts[0]}.blocks.{parts[2]}.{_LAYER_NAMES[inner]}.{leaf}"
    elif module in _TOP_NAMES:
        target = _TOP_NAMES[module]
        return target if target in _BARE else f"{target}.{leaf}"
    raise BuildError(f"{hf_name} is not a parameter of Hugging Face's Whisper (an unexpected checkpoint)")


def openai_state_dict(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's weights under openai's names, in fp16 (the converter casts to fp16 as it reads)."""
    import torch
    from safetensors import safe_open

    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise BuildError(f"{checkpoint} holds no *.safetensors weights")
    state: dict[str, Any] = {}
    projection = None
    for path in files:
        with safe_open(str(path), framework="pt") as weights:
            for key in weights.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensor = weights.get_tensor(key).to(torch.float16)
                name = openai_name(key)
                if name is None:
                    projection = tensor
                else:
                    state[name] = tensor
    embedding = state.get("decoder.token_embedding.weight")
    if projection is not None and embedding is not None and not torch.equal(projection, embedding):
        raise BuildError(f"{checkpoint}: proj_out differs from the token embedding; openai's format ties them")
    return state


def mel_filters(n_mels: int) -> Any:
    """The Slaney-style mel filterbank of openai-whisper's ``mel_filters.npz`` (librosa's default): [n_mels, 201]."""
    import numpy as np
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(
        num_frequency_bins=N_FFT // 2 + 1,
        num_mel_filters=n_mels,
        min_frequency=0.0,
        max_frequency=SAMPLE_RATE / 2,
        sampling_rate=SAMPLE_RATE,
        norm="slaney",
        mel_scale="slaney",
    )
    return np.ascontiguousarray(bank.T, dtype=np.float32)


def _unicode_to_byte() -> dict[str, int]:
    """The inverse of the byte-level BPE alphabet (GPT-2's: printable bytes stand for themselves, the others are
    shifted to code points from 256 up)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            mapping[chr(256 + shifted)] = b
            shifted += 1
    return mapping


def tiktoken_lines(tokenizer_json: dict[str, Any]) -> list[str]:
    """tiktoken's BPE file from a byte-level tokenizer.json: ``base64(token bytes) rank`` per regular token, rank =
    id, special (added) tokens left out, as openai-whisper's ``multilingual.tiktoken``."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise BuildError("tokenizer.json has no byte-level BPE vocabulary")
    special = {token["content"] for token in tokenizer_json.get("added_tokens", []) if token.get("special", True)}
    to_byte = _unicode_to_byte()
    lines = []
    for token, rank in sorted(model["vocab"].items(), key=lambda item: item[1]):
        if token in special:
            continue
        try:
            data = bytes(to_byte[char] for char in token)
        except KeyError:
            raise BuildError(f"tokenizer.json token {token!r} is not byte-level BPE") from None
        lines.append(f"{base64.b64encode(data).decode()} {rank}")
    return lines


def write_assets(checkpoint: Path, folder: Path, name: str) -> list[Path]:
    """Write ``<name>.pt``, ``mel_filters.npz`` and ``multilingual.tiktoken`` from a Hugging Face Whisper."""
    import numpy as np
    import torch

    config = read_config(checkpoint)
    if config is None:
        raise BuildError(f"{checkpoint} has no config.json")
    dims = WhisperDims.from_config(config)
    tokenizer = checkpoint / "tokenizer.json"
    if not tokenizer.is_file():
        raise BuildError(f"{checkpoint} has no tokenizer.json (the vocabulary multilingual.tiktoken is written from)")
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"{name}.pt"
    torch.save({"dims": dims.as_dict(), "model_state_dict": openai_state_dict(checkpoint)}, model)
    filters = folder / MEL_FILTERS
    np.savez_compressed(filters, **{f"mel_{dims.n_mels}": mel_filters(dims.n_mels)})
    bpe = folder / TIKTOKEN
    bpe.write_text("\n".join(tiktoken_lines(json.loads(tokenizer.read_text()))) + "\n")
    return [model, filters, bpe]
