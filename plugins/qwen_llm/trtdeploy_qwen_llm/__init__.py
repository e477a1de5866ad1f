"""trtdeploy plugin for Qwen2, Qwen2.5 and Qwen3 LLMs: text in, text out, through trtdeploy's text-LLM pipeline
(:class:`trtdeploy.TextLLMSpec`: the tensors of TensorRT-LLM's ensemble, so that its clients work unchanged)."""

from __future__ import annotations

from typing import Any

import trtdeploy
from trtdeploy import TextLLMSpec

__version__ = "0.1.0"


class QwenLLM(TextLLMSpec):
    name = "qwen_llm"
    description = "Qwen2, Qwen2.5 and Qwen3 causal LMs: text in, text out (TRT-LLM ensemble tensors)"
    default_repo = "Qwen/Qwen2.5-0.5B-Instruct"
    architectures = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
    tokenizer_kind = "qwen2"  # byte-level BPE, ChatML, no BOS


@trtdeploy.hookimpl
def register_models(register: Any) -> None:
    register(QwenLLM())
