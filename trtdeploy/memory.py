"""Whether a model fits a GPU: weights, KV cache and activations per GPU, estimated from its ``config.json``.

An estimate, not a measurement: it is meant to reject points that cannot work (a 72B model in fp16 on one GPU) and
to say how much room a point leaves, before hours go into a build. Embeddings and the LM head stay in 16 bits under
weight-only and AWQ quantization (TRT-LLM's defaults); FP8 and SmoothQuant keep them in 16 bits too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
#: Bytes per weight of the transformer blocks for each precision (scales of the quantized formats included).
WEIGHT_BYTES = {
    "fp32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8_wo": 1.0 + 2 / 4096,
    "int8_sq": 1.0 + 2 / 4096,
    "int4_wo": 0.5 + 2 / 4096,
    "int4_awq": 0.5 + 2 / 128,  # one 16-bit scale per 128-weight group
}
#: Bytes per KV-cache element: FP8 builds keep an FP8 cache, the rest the activation type (fp32: 4).
KV_BYTES = {"fp32": 4, "fp8": 1}
#: CUDA context, the runtime's own buffers and allocator slack, per GPU.
RUNTIME_OVERHEAD_GIB = 1.5
#: Share of a GPU's memory a process can count on (the driver and other processes keep the rest).
USABLE_SHARE = 0.95
#: Inputs an encoder-decoder engine encodes at once: the torch engine's batch (bounding its activations at
#: admission), and what the estimate counts for TensorRT-LLM's too.
ENCODER_BATCH = 16


def read_config(model_dir: Path) -> dict | None:
    """A checkpoint's ``config.json``, or None when it is missing or unreadable (not downloaded yet)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that decide its memory."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    num_experts: int = 1
    #: A mixture of experts' per-expert MLP width (``moe_intermediate_size``; 0: ``intermediate_size``) and its
    #: shared expert's (Qwen2-MoE's ``shared_expert_intermediate_size``; 0: none).
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    #: Weight matrices of the MLP: 3 (gated: gate, up, down) or 2 (Whisper's fc1, fc2).
    mlp_matrices: int = 3
    #: Weights outside the decoder blocks and embeddings (an encoder, cross-attention projections).
    extra_params: int = 0
    #: Encoder frames each sequence keeps in a cross-attention KV cache (Whisper: 1500), beside its own tokens.
    cross_tokens: int = 0

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        if config.get("model_type") == "whisper":
            return cls.from_whisper_config(config)
        text = config.get("text_config", config)  # multimodal configs nest the LLM's
        heads = text["num_attention_heads"]
        hidden = text["hidden_size"]
        return cls(
            hidden_size=hidden,
            intermediate_size=text.get("intermediate_size") or 4 * hidden,
            num_layers=text["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads") or heads,
            head_dim=text.get("head_dim") or hidden // heads,
            vocab_size=text["vocab_size"],
            tied_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            num_experts=text.get("num_experts") or text.get("num_local_experts") or 1,
            expert_intermediate_size=text.get("moe_intermediate_size") or 0,
            shared_expert_intermediate_size=text.get("shared_expert_intermediate_size") or 0,
        )

    @classmethod
    def from_whisper_config(cls, config: dict) -> ModelShape:
        """Whisper: the decoder's blocks (2-matrix MLPs) with its cross-attention and the whole encoder as extra
        weights, and a cross-attention cache of the encoder's frames per sequence."""
        hidden = config["d_model"]
        heads = config["decoder_attention_heads"]
        decoder_layers, encoder_layers = config["decoder_layers"], config["encoder_layers"]
        frames = config.get("max_source_positions", 1500)
        encoder = encoder_layers * (4 * hidden * hidden + 2 * hidden * config["encoder_ffn_dim"])
        convolutions = 3 * hidden * (config.get("num_mel_bins", 80) + hidden)
        positions = hidden * (frames + config.get("max_target_positions", 448))
        return cls(
            hidden_size=hidden,
            intermediate_size=config["decoder_ffn_dim"],
            num_layers=decoder_layers,
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=hidden // heads,
            vocab_size=config["vocab_size"],
            tied_embeddings=True,
            mlp_matrices=2,
            extra_params=encoder + convolutions + positions + decoder_layers * 4 * hidden * hidden,
            cross_tokens=frames,
        )

    @classmethod
    def read(cls, model_dir: Path) -> ModelShape | None:
        """The shape of the checkpoint in ``model_dir``, or None when it has no readable config.json."""
        config = read_config(model_dir)
        try:
            return None if config is None else cls.from_config(config)
        except (KeyError, TypeError):
            return None

    @property
    def block_params(self) -> int:
        """Weights of the transformer blocks (attention and MLP; norms are negligible)."""
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        expert = self.expert_intermediate_size or self.intermediate_size
        mlp = self.mlp_matrices * self.hidden_size * (expert * self.num_experts + self.shared_expert_intermediate_size)
        return self.num_layers * (attention + mlp) + self.extra_params

    @property
    def embedding_params(self) -> int:
        """The token embedding and, unless tied to it, the LM head."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        return self.block_params + self.embedding_params


@dataclass(frozen=True)
class MemoryEstimate:
    """GiB per GPU of one build point."""

    weights: float
    kv_cache: float
    activations: float
    overhead: float
    available: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def describe(self) -> str:
        return (
            f"{self.total:.1f} GiB per GPU (weights {self.weights:.1f}, KV cache {self.kv_cache:.1f}, "
            f"activations {self.activations:.1f}, runtime {self.overhead:.1f}) of {self.available:.1f} GiB usable"
        )


def kv_bytes_per_token(
    shape: ModelShape, precision: str, tp: int = 1, pp: int = 1, kv_cache_dtype: str | None = None
) -> float:
    """KV-cache bytes one token takes on one GPU (heads split by TP, at least one per rank; layers by PP), in
    ``kv_cache_dtype`` (fp8, int8) or else the precision's KV type."""
    kv_heads = max(1, -(-shape.num_kv_heads // tp))
    layers = -(-shape.num_layers // pp)
    element = 1 if kv_cache_dtype in ("fp8", "int8") else KV_BYTES.get(precision, 2)
    return 2 * layers * kv_heads * shape.head_dim * element


def estimate(
    shape: ModelShape,
    *,
    precision: str,
    max_batch_size: int,
    max_seq_len: int,
    max_num_tokens: int,
    memory_gib: float,
    tp: int = 1,
    pp: int = 1,
    kv_cache_dtype: str | None = None,
) -> MemoryEstimate:
    """Memory per GPU for every sequence of the batch at full length, and the activations of one engine step."""
    weights = (shape.block_params * WEIGHT_BYTES[precision] / (tp * pp) + shape.embedding_params * 2 / tp) / GIB
    tokens = max_seq_len + shape.cross_tokens
    kv_cache = max_batch_size * tokens * kv_bytes_per_token(shape, precision, tp, pp, kv_cache_dtype) / GIB
    # hidden states, fused QKV and the MLP's intermediate activations of one step's tokens, in 16 bits (an
    # encoder's step: the frames of up to ENCODER_BATCH inputs)
    width = 4 * shape.hidden_size + 2 * shape.intermediate_size // tp
    step_tokens = max(max_num_tokens, shape.cross_tokens * min(max_batch_size, ENCODER_BATCH))
    activations = step_tokens * width * 2 / GIB
    return MemoryEstimate(weights, kv_cache, activations, RUNTIME_OVERHEAD_GIB, memory_gib * USABLE_SHARE)
