"""The LLM contract on TensorRT-LLM's LLM API (the PyTorch backend of TensorRT-LLM 1.x): token ids in, token ids out.

:class:`LlmApiGenerator` offers the Triton model what the torch runtime's generator offers (``submit``/``close``):
each request becomes ``llm.generate_async`` calls on an asyncio loop of its own thread, streamed token ids go to the
request's sink as they come, a cancelled request is aborted. TensorRT-LLM itself runs the continuous batch (and,
for TP/PP, its own MPI workers). ``tensorrt_llm`` is imported only by :func:`load_from_parameters`.

The contract's inputs map onto ``tensorrt_llm.SamplingParams`` (field names of TensorRT-LLM 1.0's
``tensorrt_llm/sampling_params.py``; not run here, no TensorRT-LLM on the machines this was written on): see
:func:`sampling_arguments`. The LLM API takes stop and bad words as token ids only when it has no tokenizer (words
of several tokens need its tokenizer, which the contract's callers keep), refuses several greedy sequences, and has
no beam search or per-request perf metrics here: those requests are refused by name (:data:`CAPABILITIES`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import numpy as np

from ...backend_utils import ModelParameters
from ..contract import Capabilities, GenerationRequest, ResponseSink, SequenceOutput, refusal, special_tokens

log = logging.getLogger(__name__)

CAPABILITIES = Capabilities("trtllm_pytorch", multi_token_words=False, greedy_return_sequences=False)


def sampling_arguments(request: GenerationRequest, end_ids: frozenset[int], pad_id: int) -> dict[str, Any]:
    """``tensorrt_llm.SamplingParams`` keyword arguments for a contract request (TensorRT-LLM's defaults where the
    request asks for nothing).

    Greedy requests (see :class:`~trtdeploy.engines.contract.SamplingParams`) ask for top_k 1; a request that
    never stops (``end_id`` -1) ignores the end token; several end tokens become ``end_id`` plus stop token ids.
    Stop words (single tokens, see :data:`CAPABILITIES`) join the stop token ids and stay in the output, as the
    C++ backend keeps them (``include_stop_str_in_output``); bad words become ``bad_token_ids``; ``min_length``
    becomes ``min_tokens`` (TensorRT-LLM holds back ``end_id`` only); ``num_return_sequences`` becomes ``n``;
    ``return_log_probs`` asks for the chosen token's log probability (``logprobs`` 1).
    """
    sampling = request.sampling
    stops = sorted(request.stop_ids(end_ids))
    arguments: dict[str, Any] = {
        "max_tokens": request.max_new_tokens,
        "pad_id": pad_id,
        "detokenize": False,
        "seed": sampling.seed,
        "repetition_penalty": sampling.repetition_penalty,
    }
    if sampling.greedy:
        arguments["top_k"] = 1
    else:
        arguments["temperature"] = sampling.temperature
        if sampling.top_k > 0:
            arguments["top_k"] = sampling.top_k
        if sampling.uses_top_p:
            arguments["top_p"] = sampling.top_p
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(sampling, name):
            arguments[name] = getattr(sampling, name)
    stop_token_ids = stops[1:] + [word[0] for word in request.stop_words]
    if stops:
        arguments["end_id"] = stops[0]
    else:
        arguments["end_id"] = pad_id
        arguments["ignore_eos"] = True
    if stop_token_ids:
        arguments["stop_token_ids"] = stop_token_ids
    if request.stop_words:
        arguments["include_stop_str_in_output"] = True
    if request.bad_words:
        arguments["bad_token_ids"] = [word[0] for word in request.bad_words]
    if request.min_tokens:
        arguments["min_tokens"] = request.min_tokens
    if request.num_return_sequences > 1:
        arguments["n"] = request.num_return_sequences
    if request.embedding_bias is not None:
        import torch

        arguments["embedding_bias"] = torch.from_numpy(request.embedding_bias)
    if request.return_log_probs:
        arguments["logprobs"] = 1
    for name in ("return_context_logits", "return_generation_logits"):
        if getattr(request, name):
            arguments[name] = True
    return arguments


def _numpy(values: Any, what: str) -> np.ndarray:
    if values is None:
        raise ValueError(f"TensorRT-LLM returned no {what}")
    return values.float().cpu().numpy() if hasattr(values, "cpu") else np.asarray(values, dtype=np.float32)


def _log_probs(completion: Any, start: int, end: int) -> list[float]:
    """The log probabilities of a sequence's ids ``[start, end)``: ``logprobs`` holds one entry per id so far, a
    float or a dict by token id of floats or Logprobs."""
    entries = completion.logprobs
    if entries is None or len(entries) < end:
        raise ValueError("TensorRT-LLM returned no log probabilities for every token")
    found = []
    for token, entry in zip(completion.token_ids[start:end], entries[start:end], strict=True):
        value = entry.get(token) if isinstance(entry, dict) else entry
        found.append(float(getattr(value, "logprob", value)))
    return found


def _generation_logits(completion: Any, start: int, end: int) -> np.ndarray:
    """The generation logits of a sequence's ids ``[start, end)``. Offline, ``generation_logits`` has a row per id;
    streaming, TensorRT-LLM keeps the latest response's rows only (``PyResult.generation_logits``): either way the
    rows are those of the last ids."""
    logits = completion.generation_logits
    if logits is None:
        raise ValueError("TensorRT-LLM returned no generation logits")
    first = len(completion.token_ids) - len(logits)  # the id of the first row
    if start < first or end - first > len(logits):
        raise ValueError("TensorRT-LLM returned no generation logits for every token")
    return _numpy(logits[start - first : end - first], "generation logits")


class LlmApiGenerator:
    """Serves contract requests with a ``tensorrt_llm.LLM`` (or anything with its ``generate_async``)."""

    def __init__(
        self,
        llm: Any,
        *,
        sampling_params: type,
        end_ids: frozenset[int],
        pad_id: int,
        max_input_len: int,
        cancel_check_period: float = 0.1,
    ):
        self.llm = llm
        self.sampling_params = sampling_params
        self.end_ids = end_ids
        self.pad_id = pad_id
        self.max_input_len = max_input_len
        self.cancel_check_period = cancel_check_period
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trtdeploy-llmapi", daemon=True)
        self._thread.start()

    def submit(self, request: GenerationRequest, sink: ResponseSink) -> None:
        """Queue a request; its results (or an error) arrive at ``sink``."""
        problem = self._check(request)
        if problem:
            sink.send_error(problem)
            return
        asyncio.run_coroutine_threadsafe(self._serve(request, sink), self._loop)

    def close(self, timeout: float = 30.0) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        shutdown = getattr(self.llm, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def _check(self, request: GenerationRequest) -> str | None:
        if not request.input_ids or any(not prompt for prompt in request.input_ids):
            return "input_lengths is 0: the prompt is empty"
        problem = refusal(request, CAPABILITIES)
        if problem:
            return problem
        if request.streaming and len(request.input_ids) > 1:
            return f"streaming takes one sequence per request (got a batch of {len(request.input_ids)})"
        if request.max_new_tokens < 1:
            return f"request_output_len must be at least 1 (got {request.max_new_tokens})"
        longest = max(len(prompt) for prompt in request.input_ids)
        if longest > self.max_input_len:
            return f"input length {longest} exceeds max_input_len {self.max_input_len}"
        return None

    async def _serve(self, request: GenerationRequest, sink: ResponseSink) -> None:
        params = self.sampling_params(**sampling_arguments(request, self.end_ids, self.pad_id))
        results = []
        try:
            results = [
                self.llm.generate_async(prompt, sampling_params=params, streaming=request.streaming)
                for prompt in request.input_ids
            ]
            watcher = asyncio.ensure_future(self._watch_cancel(sink, results, asyncio.current_task()))
            try:
                outputs = [
                    output
                    for row, result in enumerate(results)
                    for output in await self._collect(row, result, request, sink)
                ]
            finally:
                watcher.cancel()
        except asyncio.CancelledError:
            sink.send_error("the request was cancelled", cancelled=True)
            return
        except Exception as exc:  # TensorRT-LLM's errors become the request's, the model keeps serving
            log.exception("generation failed")
            for result in results:
                _abort(result)
            sink.send_error(f"TensorRT-LLM: {exc}")
            return
        sink.send_final(None if request.streaming else outputs)

    async def _collect(
        self, row: int, result: Any, request: GenerationRequest, sink: ResponseSink
    ) -> list[SequenceOutput]:
        """The sequences of one prompt, without their end token; streaming, each new piece goes to ``sink`` as it
        comes (offline, the returned sequences are the answer)."""
        sent: dict[int, int] = {}  # index -> how many of the sequence's ids went out
        cum_log_probs: dict[int, float] = {}  # index -> the sum of their log probabilities
        last = None
        async for output in result:
            last = output
            if not request.streaming:
                continue
            for position, completion in enumerate(output.outputs):
                index = getattr(completion, "index", position)
                start, end = sent.get(index, 0), self._length(completion, output)
                if end > start:
                    piece = self._sequence(
                        row, index, completion, output, request, start, end, cum_log_probs.get(index)
                    )
                    sink.send_tokens(piece)
                    sent[index], cum_log_probs[index] = end, piece.cum_log_prob
        if last is None or request.streaming:
            return []
        return [
            self._sequence(row, getattr(completion, "index", position), completion, last, request)
            for position, completion in enumerate(last.outputs)
        ]

    def _length(self, completion: Any, output: Any) -> int:
        """How many ids the sequence has so far, the end token that finished it left out."""
        ids = completion.token_ids
        finished = output.finished or getattr(completion, "finish_reason", None) is not None
        return len(ids) - 1 if finished and ids and ids[-1] in self.end_ids else len(ids)

    def _sequence(
        self,
        row: int,
        index: int,
        completion: Any,
        output: Any,
        request: GenerationRequest,
        start: int = 0,
        end: int | None = None,
        cum_log_prob: float | None = None,
    ) -> SequenceOutput:
        """The sequence's ids ``[start, end)`` with what the request asks to come with them: a streamed piece (its
        cumulative log probability continuing ``cum_log_prob``, that of the ids before), or (by default, offline)
        the whole sequence, after its prompt when the request keeps the input in the output. Only the new ids' log
        probabilities and logits are read, so a stream costs time in proportion to its length."""
        end = self._length(completion, output) if end is None else end
        prompt = request.input_ids[row] if not (request.streaming or request.exclude_input) else []
        log_probs = _log_probs(completion, start, end) if request.return_log_probs else None
        return SequenceOutput(
            prompt + list(completion.token_ids[start:end]),
            row=row,
            index=index,
            prompt_tokens=len(prompt),
            log_probs=log_probs,
            cum_log_prob=None if log_probs is None else (cum_log_prob or 0.0) + sum(log_probs),
            generation_logits=_generation_logits(completion, start, end) if request.return_generation_logits else None,
            context_logits=_numpy(output.context_logits, "context logits")
            if request.return_context_logits and start == 0
            else None,
        )

    async def _watch_cancel(self, sink: ResponseSink, results: list[Any], serving: asyncio.Task | None) -> None:
        """Abort the request's generations and cancel its serving task once the client gives up."""
        while not sink.is_cancelled():
            await asyncio.sleep(self.cancel_check_period)
        for result in results:
            _abort(result)
        if serving is not None:
            serving.cancel()


def _abort(result: Any) -> None:
    abort = getattr(result, "abort", None)
    if abort is not None:
        abort()


def load_from_parameters(params: ModelParameters) -> LlmApiGenerator:
    """A ``tensorrt_llm.LLM`` on the checkpoint, with the settings of the Triton model's config.pbtxt."""
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi import KvCacheConfig

    model_dir = params.str("hf_model_dir")
    llm = LLM(
        model=model_dir,
        tensor_parallel_size=params.int("tensor_parallel_size"),
        pipeline_parallel_size=params.int("pipeline_parallel_size"),
        dtype=params.str("dtype", "auto"),
        max_batch_size=params.int("max_batch_size"),
        max_num_tokens=params.int("max_num_tokens"),
        max_input_len=params.int("max_input_len"),
        max_seq_len=params.int("max_seq_len"),
        enable_chunked_prefill=True,
        skip_tokenizer_init=True,  # token ids in and out: the contract's callers tokenize
        kv_cache_config=KvCacheConfig(
            free_gpu_memory_fraction=params.float("kv_cache_free_gpu_mem_fraction"),
            max_tokens=params.int("max_tokens_in_paged_kv_cache"),
            enable_block_reuse=params.bool("enable_kv_cache_reuse", True),
        ),
    )
    end_ids, pad_id = special_tokens(model_dir)
    return LlmApiGenerator(
        llm,
        sampling_params=SamplingParams,
        end_ids=end_ids,
        pad_id=pad_id,
        max_input_len=params.int("max_input_len"),
        cancel_check_period=params.int("cancellation_check_period_ms", 100) / 1000,
    )
