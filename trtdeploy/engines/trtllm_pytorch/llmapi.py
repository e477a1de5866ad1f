"""The LLM contract on TensorRT-LLM's LLM API (the PyTorch backend of TensorRT-LLM 1.x): token ids in, token ids out.

:class:`LlmApiGenerator` offers the Triton model what the torch runtime's generator offers (``submit``/``close``):
each request becomes ``llm.generate_async`` calls on an asyncio loop of its own thread, streamed token ids go to the
request's sink as they come, a cancelled request is aborted. TensorRT-LLM itself runs the continuous batch (and,
for TP/PP, its own MPI workers). ``tensorrt_llm`` is imported only by :func:`load_from_parameters`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from ...backend_utils import ModelParameters
from ..contract import GenerationRequest, ResponseSink, special_tokens

log = logging.getLogger(__name__)


def sampling_arguments(request: GenerationRequest, end_ids: frozenset[int], pad_id: int) -> dict[str, Any]:
    """``tensorrt_llm.SamplingParams`` keyword arguments for a contract request.

    Greedy requests (see :class:`~trtdeploy.engines.contract.SamplingParams`) ask for top_k 1; a request that
    never stops (``end_id`` -1) ignores the end token; several end tokens become ``end_id`` plus stop token ids.
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
    if stops:
        arguments["end_id"] = stops[0]
        if len(stops) > 1:
            arguments["stop_token_ids"] = stops[1:]
    else:
        arguments["end_id"] = pad_id
        arguments["ignore_eos"] = True
    return arguments


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
                outputs = [await self._collect(result, sink if request.streaming else None) for result in results]
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
        if request.streaming:
            sink.send_final(None)
        elif request.exclude_input:
            sink.send_final(outputs)
        else:
            sink.send_final([prompt + out for prompt, out in zip(request.input_ids, outputs, strict=True)])

    async def _collect(self, result: Any, stream: ResponseSink | None) -> list[int]:
        """One sequence's generated ids (without its end token); with ``stream``, each new piece as it comes."""
        sent: list[int] = []
        async for output in result:
            tokens = list(output.outputs[0].token_ids)
            if output.finished and tokens and tokens[-1] in self.end_ids:
                tokens = tokens[:-1]
            new = tokens[len(sent) :]
            sent = tokens
            if stream is not None and new:
                stream.send_tokens(new)
        return sent

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
