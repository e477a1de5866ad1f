"""Random-weight Spark-TTS checkpoints in the official layout, for tests, the quickstart and GPU benchmarks.

A random LLM over Spark-TTS's vocabulary (166,000 tokens, 8,192 of them semantic) would mostly answer with text
tokens, giving little audio, and almost never its end token. So the LLM written here is made to speak: the
embedding rows (tied with the output layer) of every token but the semantic ones are zero, so every logit but the
semantic tokens' is exactly 0 and sampling picks semantic tokens. It never ends on its own: each request makes
exactly its token cap of audio, which is what benchmarks of a given output length need. ``speaks="nothing"``
zeroes the semantic rows instead (an LLM that never makes audio, for error-path tests).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

from trtdeploy import QWEN2_0_5B, TinyShape

from .prompt import added_tokens

#: The real LLM/ shape (Qwen2, 0.5B) and a tiny one for CPU tests.
FULL_LLM = replace(QWEN2_0_5B, vocab_size=166000)
TINY_LLM = TinyShape()


def write_random_checkpoint(
    dest: Path,
    *,
    seed: int = 0,
    size: Literal["tiny", "full"] = "tiny",
    speaks: Literal["semantic", "nothing"] = "semantic",
) -> None:
    """Write config.yaml, BiCodec/, wav2vec2-large-xlsr-53/ and LLM/ with random weights into ``dest``."""
    from trtdeploy import write_random_causal_lm

    from .bicodec import write_random_checkpoint_parts

    write_random_checkpoint_parts(dest, size=size, seed=seed)
    llm = dest / "LLM"
    write_random_causal_lm(
        llm,
        architecture="Qwen2ForCausalLM",
        shape=FULL_LLM if size == "full" else TINY_LLM,
        added_tokens=added_tokens(),
        seed=seed,
        max_position_embeddings=32768,
        dtype="bfloat16" if size == "full" else "float32",
    )
    _make_speak(llm, speaks)


def _make_speak(llm: Path, speaks: Literal["semantic", "nothing"]) -> None:
    """Zero the tied embedding rows of the tokens the LLM must never say (see the module docstring)."""
    import torch
    from safetensors.torch import load_file, save_file

    from .prompt import PromptCodec

    semantic = torch.from_numpy(PromptCodec.load(llm).semantic_ids).long()
    weights_file = llm / "model.safetensors"
    weights = load_file(str(weights_file))
    embedding = weights["model.embed_tokens.weight"]
    silent = torch.ones(embedding.shape[0], dtype=torch.bool)
    silent[semantic] = False
    if speaks == "nothing":
        silent = ~silent
    embedding[silent] = 0
    save_file(weights, str(weights_file), metadata={"format": "pt"})
