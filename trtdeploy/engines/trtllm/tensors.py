"""The tensors of the ``tensorrt_llm`` model per backend release family, as the C++ backend reads them.

Families: "0.17" (0.17-0.18), "0.19" (0.19) and "1.x" (0.20-1.2). Upstream renamed ``random_seed`` to ``seed`` and
``min_length`` to ``min_tokens`` after 0.19.0 and replaced ``return_kv_cache_reuse_stats`` with
``return_perf_metrics`` in 0.19. Exposed: the LLM contract, sampling and stop controls, log-probs and logits, and
the encoder inputs of encoder-decoder models; not exposed: LoRA, draft/speculative, prompt-table, multimodal and
KV-retention tensors (none of trtdeploy's models use them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str
    dims: tuple[int, ...] = (1,)
    optional: bool = True
    #: Per-request scalars arrive as [1] and the backend reads them as scalars.
    reshape_scalar: bool = False
    ragged: bool = False


def _scalar(name: str, data_type: str, optional: bool = True) -> Tensor:
    return Tensor(name, data_type, (1,), optional, reshape_scalar=True)


def _ragged(name: str, data_type: str, dims: tuple[int, ...] = (-1,), optional: bool = True) -> Tensor:
    return Tensor(name, data_type, dims, optional, ragged=True)


def renamed(family: str) -> dict[str, str]:
    """The LLM contract's input names that this family's backend spells differently."""
    return {"random_seed": "seed", "min_length": "min_tokens"} if family == "1.x" else {}


def inputs(family: str, *, encoder_decoder: bool) -> list[Tensor]:
    names = renamed(family)
    found = [
        _ragged("input_ids", "TYPE_INT32"),
        _scalar("input_lengths", "TYPE_INT32", optional=False),
        _scalar("request_output_len", "TYPE_INT32", optional=False),
        _scalar("num_return_sequences", "TYPE_INT32"),
        _scalar("end_id", "TYPE_INT32"),
        _scalar("pad_id", "TYPE_INT32"),
        _ragged("stop_words_list", "TYPE_INT32", (2, -1)),
        _ragged("bad_words_list", "TYPE_INT32", (2, -1)),
        _ragged("embedding_bias", "TYPE_FP32"),
        _scalar("beam_width", "TYPE_INT32"),
        _scalar("temperature", "TYPE_FP32"),
        _scalar("runtime_top_k", "TYPE_INT32"),
        _scalar("runtime_top_p", "TYPE_FP32"),
        _scalar("len_penalty", "TYPE_FP32"),
        _scalar("early_stopping", "TYPE_BOOL"),
        _scalar("repetition_penalty", "TYPE_FP32"),
        _scalar(names.get("min_length", "min_length"), "TYPE_INT32"),
        _scalar("presence_penalty", "TYPE_FP32"),
        _scalar("frequency_penalty", "TYPE_FP32"),
        _scalar(names.get("random_seed", "random_seed"), "TYPE_UINT64"),
        _scalar("return_log_probs", "TYPE_BOOL"),
        _scalar("return_context_logits", "TYPE_BOOL"),
        _scalar("return_generation_logits", "TYPE_BOOL"),
        _scalar("return_kv_cache_reuse_stats" if family == "0.17" else "return_perf_metrics", "TYPE_BOOL"),
        _scalar("exclude_input_in_output", "TYPE_BOOL"),
        _scalar("stop", "TYPE_BOOL"),
        _scalar("streaming", "TYPE_BOOL"),
    ]
    if encoder_decoder:
        found += [
            _ragged("encoder_input_features", "TYPE_FP16", (-1, -1)),
            _scalar("encoder_output_lengths", "TYPE_INT32"),
            _ragged("decoder_input_ids", "TYPE_INT32"),
            _scalar("decoder_input_lengths", "TYPE_INT32"),
            _ragged("cross_attention_mask", "TYPE_BOOL", (-1, -1)),
        ]
    return found


OUTPUTS = [
    Tensor("output_ids", "TYPE_INT32", (-1, -1), optional=False),
    Tensor("sequence_length", "TYPE_INT32", (-1,), optional=False),
    Tensor("cum_log_probs", "TYPE_FP32", (-1,), optional=False),
    Tensor("output_log_probs", "TYPE_FP32", (-1, -1), optional=False),
    Tensor("context_logits", "TYPE_FP32", (-1, -1), optional=False),
    Tensor("generation_logits", "TYPE_FP32", (-1, -1, -1), optional=False),
    Tensor("batch_index", "TYPE_INT32", (1,), optional=False),
    Tensor("sequence_index", "TYPE_INT32", (1,), optional=False),
]
