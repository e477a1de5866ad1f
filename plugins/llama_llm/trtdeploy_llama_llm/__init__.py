"""trtdeploy plugin for Llama 2/3.x and Mistral causal LMs: text in, text out, through trtdeploy's text-LLM pipeline
(:class:`trtdeploy.TextLLMSpec`: the tensors of TensorRT-LLM's ensemble, so that its clients work unchanged)."""

from __future__ import annotations

from typing import Any

import trtdeploy
from trtdeploy import TextLLMSpec

__version__ = "0.1.0"

#: config.json values of Llama 3.2 (1B/3B) that the family's defaults do not give: Llama 3.1's rope scaling (which
#: stretches the low frequencies for 128K positions), tied embeddings.
LLAMA32_CONFIG: dict[str, Any] = {
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}
#: Mistral-7B-v0.3's: no sliding window, RoPE base 10^6, 32K positions.
MISTRAL_V03_CONFIG: dict[str, Any] = {"sliding_window": None, "rope_theta": 1e6, "max_position_embeddings": 32768}


class LlamaLLM(TextLLMSpec):
    name = "llama_llm"
    description = "Llama 2, 3, 3.1, 3.2 and 3.3 causal LMs: text in, text out (TRT-LLM ensemble tensors)"
    default_repo = "meta-llama/Llama-3.2-1B-Instruct"
    architectures = ("LlamaForCausalLM",)
    tokenizer_kind = "llama3"  # tiktoken-split byte-level BPE, <|begin_of_text|> BOS, header chat template
    # Llama 3.x Instruct's end of turn, 3.1's end of a tool call's message, and the end of a text: many fine-tunes'
    # generation_config.json lists only one of them (those a checkpoint's tokenizer lacks are left out: Llama 2)
    end_tokens = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
    random_config = LLAMA32_CONFIG


class MistralLLM(TextLLMSpec):
    name = "mistral_llm"
    description = "Mistral 7B (v0.1-v0.3) causal LMs: text in, text out (TRT-LLM ensemble tensors)"
    default_repo = "mistralai/Mistral-7B-Instruct-v0.3"
    architectures = ("MistralForCausalLM",)
    tokenizer_kind = "llama"  # sentencepiece with byte fallback, <s> BOS, [INST] chat template
    random_config = MISTRAL_V03_CONFIG


@trtdeploy.hookimpl
def register_models(register: Any) -> None:
    register(LlamaLLM())
    register(MistralLLM())
