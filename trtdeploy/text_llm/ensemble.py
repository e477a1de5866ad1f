"""The ``ensemble`` model's tensors: those of tensorrtllm_backend's ``inflight_batcher_llm/ensemble`` of the release
the deployment targets, and where each input goes.

What differs between releases (the seed and minimum-length names, the statistics switch and its outputs, the
guided-decoding inputs, the token-count switches and their outputs) is trtdeploy's row for the release
(:func:`trtdeploy.trtllm_release`, which names where each fact was read); the rest is the same in every release read
(``all_models/inflight_batcher_llm/ensemble/config.pbtxt`` of tensorrtllm_backend v0.17.0, v0.18.2 and v0.19.0, and
of TensorRT-LLM's ``triton_backend/``). Engines not tied to a release (torch, trtllm_pytorch) get the newest row's
set. The official ensemble has no ``output_ids``/``sequence_length`` outputs; this one keeps them (exact token counts
for ``trtdeploy perf``), which clients that do not ask for them never see.

An input the LLM model does not take (LoRA, prompt tables, guided decoding: no engine here builds or serves them)
goes to ``preprocessing`` instead, which refuses any value but the neutral one (false, 0, empty) by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engines.trtllm.releases import Release
    from ..spec import BuildContext

#: The official ensemble's outputs from the LLM model in every release (``text_output`` comes from postprocessing).
OUTPUTS = ("cum_log_probs", "output_log_probs", "context_logits", "generation_logits", "batch_index", "sequence_index")


@dataclass(frozen=True)
class EnsembleTensor:
    """One input of the ensemble (dims without the batch dim).

    It goes either to the LLM model (``llm``: its LLM-contract name, which the engine may spell differently:
    ``BuildContext.llm_input``) or to ``preprocessing`` (``pre``: that model's input name).
    """

    name: str
    data_type: str
    dims: tuple[int, ...] = (1,)
    llm: str = ""
    pre: str = ""
    optional: bool = True
    ragged: bool = False


def release(ctx: BuildContext) -> Release:
    """The release whose official ensemble the deployment reproduces: the trtllm engine's, else the newest."""
    from ..engines.trtllm import releases  # on first use: the engine's package loads numpy

    version = ctx.point.engine_version
    if ctx.point.engine != "trtllm" or not version:
        return releases.newest()
    major, minor = version.split(".")[:2]
    return releases.of((int(major), int(minor)))


def inputs(release: Release) -> list[EnsembleTensor]:
    """The official ensemble's inputs in ``release``, in its order."""

    def llm(name: str, data_type: str, target: str = "", **kwargs) -> EnsembleTensor:
        return EnsembleTensor(name, data_type, llm=target or name, **kwargs)

    return [
        EnsembleTensor("text_input", "TYPE_STRING", pre="QUERY", optional=False),
        EnsembleTensor("decoder_text_input", "TYPE_STRING", pre="DECODER_QUERY"),
        EnsembleTensor("max_tokens", "TYPE_INT32", pre="REQUEST_OUTPUT_LEN", optional=False),
        llm("num_return_sequences", "TYPE_INT32"),
        EnsembleTensor("bad_words", "TYPE_STRING", (-1,), pre="BAD_WORDS_DICT"),
        EnsembleTensor("stop_words", "TYPE_STRING", (-1,), pre="STOP_WORDS_DICT"),
        llm("exclude_input_in_output", "TYPE_BOOL"),
        EnsembleTensor("end_id", "TYPE_INT32", pre="END_ID"),
        EnsembleTensor("pad_id", "TYPE_INT32", pre="PAD_ID"),
        llm("top_k", "TYPE_INT32", "runtime_top_k"),
        llm("top_p", "TYPE_FP32", "runtime_top_p"),
        llm("temperature", "TYPE_FP32"),
        llm("length_penalty", "TYPE_FP32", "len_penalty"),
        llm("repetition_penalty", "TYPE_FP32"),
        llm(release.min_tokens_input, "TYPE_INT32", "min_length"),
        llm("presence_penalty", "TYPE_FP32"),
        llm("frequency_penalty", "TYPE_FP32"),
        llm(release.seed_input, "TYPE_UINT64", "random_seed"),
        llm("return_log_probs", "TYPE_BOOL"),
        llm("return_context_logits", "TYPE_BOOL"),
        llm("return_generation_logits", "TYPE_BOOL"),
        llm(release.stats_input, "TYPE_BOOL"),
        *(llm(name, "TYPE_BOOL") for name in release.token_count_inputs),
        llm("beam_width", "TYPE_INT32"),
        llm("stream", "TYPE_BOOL", "streaming"),
        llm("prompt_embedding_table", "TYPE_FP16", dims=(-1, -1)),
        EnsembleTensor("prompt_table_extra_id", "TYPE_UINT64", pre="PROMPT_TABLE_EXTRA_ID"),
        llm("prompt_vocab_size", "TYPE_INT32"),
        EnsembleTensor("embedding_bias_words", "TYPE_STRING", (-1,), pre="EMBEDDING_BIAS_WORDS"),
        EnsembleTensor("embedding_bias_weights", "TYPE_FP32", (-1,), pre="EMBEDDING_BIAS_WEIGHTS"),
        llm("lora_task_id", "TYPE_UINT64"),
        llm("lora_weights", "TYPE_FP16", dims=(-1, -1), ragged=True),
        llm("lora_config", "TYPE_INT32", dims=(-1, 3), ragged=True),
        *(llm(name, "TYPE_STRING", ragged=True) for name in release.guided_decoding_inputs),
    ]


def outputs(release: Release) -> tuple[str, ...]:
    """The official ensemble's outputs from the LLM model in ``release``, in its order (the template declares those
    the engine's model writes, with that model's types and dims)."""
    return (*OUTPUTS, *release.stats_outputs, *release.token_count_outputs)
