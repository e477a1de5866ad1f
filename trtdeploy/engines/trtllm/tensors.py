"""The tensors of the ``tensorrt_llm`` model as the C++ backend of a release reads and writes them.

The names that change between releases (``random_seed``/``seed``, ``min_length``/``min_tokens``, the statistics
switch and its outputs, the token-count switches and their outputs) come from the release's row in :mod:`.releases`.
Exposed: the LLM contract, sampling and stop controls, log-probs and logits, per-request statistics and token counts,
and the encoder inputs of encoder-decoder models; not exposed: LoRA, draft/speculative, prompt-table, multimodal,
guided-decoding and KV-retention tensors (none of trtdeploy's models use them).
"""

from __future__ import annotations

from ..contract import Tensor
from .releases import Release


def _scalar(name: str, data_type: str, optional: bool = True) -> Tensor:
    return Tensor(name, data_type, (1,), optional, reshape_scalar=True)


def _ragged(name: str, data_type: str, dims: tuple[int, ...] = (-1,), optional: bool = True) -> Tensor:
    return Tensor(name, data_type, dims, optional, ragged=True)


def renamed(release: Release) -> dict[str, str]:
    """The LLM contract's input names that this release's backend spells differently."""
    names = {"random_seed": release.seed_input, "min_length": release.min_tokens_input}
    return {contract: backend for contract, backend in names.items() if contract != backend}


def inputs(release: Release, *, encoder_decoder: bool) -> list[Tensor]:
    """The inputs of the ``tensorrt_llm`` model for ``release``'s backend."""
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
        _scalar(release.min_tokens_input, "TYPE_INT32"),
        _scalar("presence_penalty", "TYPE_FP32"),
        _scalar("frequency_penalty", "TYPE_FP32"),
        _scalar(release.seed_input, "TYPE_UINT64"),
        _scalar("return_log_probs", "TYPE_BOOL"),
        _scalar("return_context_logits", "TYPE_BOOL"),
        _scalar("return_generation_logits", "TYPE_BOOL"),
        _scalar(release.stats_input, "TYPE_BOOL"),
        *(_scalar(name, "TYPE_BOOL") for name in release.token_count_inputs),
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


#: The outputs every release writes.
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
#: The data type of each per-request statistic and token count (the backend writes each as [1, 1]: [1] per request).
COUNTER_TYPES = {
    "kv_cache_alloc_new_blocks": "TYPE_INT32",
    "kv_cache_reused_blocks": "TYPE_INT32",
    "kv_cache_alloc_total_blocks": "TYPE_INT32",
    "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64",
    "first_token_time_ns": "TYPE_INT64",
    "last_token_time_ns": "TYPE_INT64",
    "acceptance_rate": "TYPE_FP32",
    "total_accepted_draft_tokens": "TYPE_INT32",
    "total_draft_tokens": "TYPE_INT32",
    "num_input_tokens": "TYPE_INT32",
    "num_output_tokens": "TYPE_INT32",
}


def outputs(release: Release) -> list[Tensor]:
    """:data:`OUTPUTS`, and the statistics and token counts ``release``'s backend writes when a request asks."""
    counters = (*release.stats_outputs, *release.token_count_outputs)
    return OUTPUTS + [Tensor(name, COUNTER_TYPES[name], (1,), optional=False) for name in counters]
