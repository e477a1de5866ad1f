"""Helpers for the torch runtime tests: tiny random-weight checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY_QWEN2: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
    "bos_token_id": 1,
}


def write_tiny_model(dest: Path, architecture: str = "qwen2", seed: int = 0, **overrides: Any) -> Path:
    """Write a random-weight causal LM (``qwen2``, ``qwen3`` or ``llama``) with ``save_pretrained``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }
    config_class, model_class = classes[architecture]
    settings = {**TINY_QWEN2, **overrides}
    if architecture == "qwen3":
        settings.setdefault("head_dim", 16)
    torch.manual_seed(seed)
    model = model_class(config_class(**settings))
    # Larger-than-default weights make the logits spread out, so greedy choices are not near-ties.
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15)
    model.save_pretrained(dest)
    return dest


TINY_WHISPER: dict[str, Any] = {
    "vocab_size": 51865,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "max_target_positions": 448,
}


def write_tiny_whisper(dest: Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a random-weight ``WhisperForConditionalGeneration`` with ``save_pretrained``."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(WhisperConfig(**{**TINY_WHISPER, **overrides}))
    with torch.no_grad():  # spread-out logits, as in write_tiny_model; the sinusoidal encoder positions stay
        for name, param in model.named_parameters():
            if param.dim() > 1 and name != "model.encoder.embed_positions.weight":
                param.normal_(0.0, 0.15)
    model.save_pretrained(dest)
    return dest
