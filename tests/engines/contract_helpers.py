"""The two ends of an engine's generator in tests: a sink that records what the generator sends, and a stand-in for
TensorRT-LLM's LLM API (which cannot be installed here) to drive the trtllm_pytorch engine's generator with."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np

from trtdeploy.engines.contract import GenerationRequest
from trtdeploy.engines.trtllm_pytorch.llmapi import LlmApiGenerator
from trtdeploy.testing import RecordingSink  # noqa: F401 (the engines' tests import it from here)

#: The stand-in's end token, pad id and vocabulary size.
END, PAD, VOCAB = 7, 0, 16


class FakeLlm:
    """Stands in for ``tensorrt_llm.LLM``: answers every prompt with ``scripts[i]`` as sequence ``i``, one token per
    step, each followed by the end token when ``ends``.

    Shaped as TensorRT-LLM 1.x's LLM API (``executor/result.py``, ``_torch/pyexecutor/llm_request.py``):
    ``generate_async`` returns a result to iterate asynchronously (streaming, an output per step; offline, the
    finished output only) and to ``abort``. A completion's ``token_ids`` and ``logprobs`` hold every id so far; its
    ``generation_logits`` a row per id offline, and the latest step's row only when streaming. Token ``t`` has the
    log probability ``-t / 10``; row ``j`` of sequence ``i``'s logits is ``100 i + j`` throughout. ``fail`` raises
    at the second step, ``hang`` waits for an abort, ``missing`` names a completion field TensorRT-LLM left None.
    """

    def __init__(self, *scripts: list[int], ends: bool = True, fail: bool = False, hang: bool = False, missing=None):
        self.scripts = scripts
        self.ends, self.fail, self.hang, self.missing = ends, fail, hang, missing
        self.calls: list[tuple[list[int], Any, bool]] = []
        self.aborted = threading.Event()

    def generate_async(self, prompt, sampling_params, streaming):
        self.calls.append((prompt, sampling_params, streaming))
        return FakeResult(self, prompt, streaming)


class FakeResult:
    """One prompt's ``GenerationResult``."""

    def __init__(self, llm: FakeLlm, prompt: list[int], streaming: bool):
        self.llm, self.prompt, self.streaming = llm, prompt, streaming

    def abort(self):
        self.llm.aborted.set()

    async def __aiter__(self):
        llm = self.llm
        sequences = [script + ([END] if llm.ends else []) for script in llm.scripts]
        steps = max(len(sequence) for sequence in sequences)
        for step in range(1, steps + 1):
            if llm.fail and step == 2:
                raise RuntimeError("CUDA out of memory")
            while llm.hang and not llm.aborted.is_set():
                await asyncio.sleep(0.01)
            if llm.aborted.is_set():
                return
            if self.streaming or step == steps:
                yield SimpleNamespace(
                    outputs=[self._completion(index, sequence, step) for index, sequence in enumerate(sequences)],
                    finished=step == steps,
                    context_logits=np.ones((len(self.prompt), VOCAB), np.float32),
                )

    def _completion(self, index: int, sequence: list[int], step: int) -> SimpleNamespace:
        ids = sequence[:step]
        rows = np.arange(len(ids) - 1, len(ids)) if self.streaming else np.arange(len(ids))
        completion = SimpleNamespace(
            index=index,
            token_ids=ids,
            logprobs=[{token: SimpleNamespace(logprob=-token / 10)} for token in ids],
            generation_logits=np.repeat((100.0 * index + rows)[:, None], VOCAB, axis=1),
            finish_reason=("stop" if ids[-1] == END else "length") if step >= len(sequence) else None,
        )
        if self.llm.missing:
            setattr(completion, self.llm.missing, None)
        return completion


def run_on_llm_api(llm: FakeLlm, request: GenerationRequest, sink: RecordingSink | None = None) -> RecordingSink:
    """Serve one request with the trtllm_pytorch engine's generator over ``llm``; the sink once it is done."""
    generator = LlmApiGenerator(
        llm, sampling_params=dict, end_ids=frozenset({END}), pad_id=PAD, max_input_len=8, cancel_check_period=0.01
    )
    sink = sink or RecordingSink()
    try:
        generator.submit(request, sink)
        sink.wait(10)
    finally:
        generator.close()
    return sink
