"""The trtllm_pytorch engine: its plan and rendered model, and the contract adapter over TensorRT-LLM's LLM API.

TensorRT-LLM cannot be installed here: the adapter is driven by a stand-in with the LLM API's shape
(``generate_async`` returning an async iterator of cumulative outputs, ``abort``), which checks our side only.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from types import SimpleNamespace

import pytest

from trtdeploy import build
from trtdeploy.engines.contract import NEVER_STOP, GenerationRequest, SamplingParams
from trtdeploy.engines.trtllm_pytorch.llmapi import LlmApiGenerator, sampling_arguments
from trtdeploy.errors import UsageError

from .trtllm_helpers import QWEN25_05B, plan, real_sized

END, PAD = 7, 0


def test_sampling_arguments_follow_the_contract():
    sampled = GenerationRequest([[1, 2]], 16, sampling=SamplingParams(0.8, 50, 0.95, 1.1, 42))
    assert sampling_arguments(sampled, frozenset({END, 9}), PAD) == {
        "max_tokens": 16, "pad_id": PAD, "detokenize": False, "seed": 42, "repetition_penalty": 1.1,
        "temperature": 0.8, "top_k": 50, "top_p": 0.95, "end_id": END, "stop_token_ids": [9],
    }  # fmt: skip
    greedy = GenerationRequest([[1]], 4, end_id=NEVER_STOP, sampling=SamplingParams(temperature=0))
    arguments = sampling_arguments(greedy, frozenset({END}), PAD)
    assert arguments["top_k"] == 1 and "temperature" not in arguments
    assert arguments["ignore_eos"] is True and arguments["end_id"] == PAD
    assert sampling_arguments(GenerationRequest([[1]], 4, end_id=3), frozenset({END}), PAD)["end_id"] == 3


class FakeLlm:
    """Answers each prompt with ``script`` (ending in the end token when ``ends``), one token per step."""

    def __init__(self, script: list[int], ends: bool = True, fail: bool = False, hang: bool = False):
        self.script, self.ends, self.fail, self.hang = script, ends, fail, hang
        self.calls: list[tuple[list[int], dict, bool]] = []
        self.aborted = threading.Event()

    def generate_async(self, prompt, sampling_params, streaming):
        self.calls.append((prompt, sampling_params, streaming))
        return FakeResult(self)


class FakeResult:
    def __init__(self, llm: FakeLlm):
        self.llm = llm

    def abort(self):
        self.llm.aborted.set()

    async def __aiter__(self):
        tokens = self.llm.script + ([END] if self.llm.ends else [])
        for step in range(1, len(tokens) + 1):
            if self.llm.fail and step == 2:
                raise RuntimeError("CUDA out of memory")
            while self.llm.hang and not self.llm.aborted.is_set():
                await asyncio.sleep(0.01)
            if self.llm.aborted.is_set():
                return
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens[:step])], finished=step == len(tokens))


class Sink:
    def __init__(self, cancel_after: float | None = None):
        self.events: list[tuple] = []
        self.done = threading.Event()
        self.cancel = cancel_after

    def send_tokens(self, tokens):
        self.events.append(("tokens", tokens))

    def send_final(self, outputs):
        self.events.append(("final", outputs))
        self.done.set()

    def send_error(self, message, cancelled=False):
        self.events.append(("error", message, cancelled))
        self.done.set()

    def is_cancelled(self):
        return self.cancel is not None


def run(llm: FakeLlm, request: GenerationRequest, sink: Sink | None = None) -> Sink:
    generator = LlmApiGenerator(
        llm, sampling_params=dict, end_ids=frozenset({END}), pad_id=PAD, max_input_len=8, cancel_check_period=0.01
    )
    sink = sink or Sink()
    try:
        generator.submit(request, sink)
        assert sink.done.wait(10)
    finally:
        generator.close()
    return sink


def test_streaming_sends_each_new_piece_and_never_the_end_token():
    sink = run(FakeLlm([4, 5, 6]), GenerationRequest([[1, 2]], 8, streaming=True))
    assert sink.events == [("tokens", [4]), ("tokens", [5]), ("tokens", [6]), ("final", None)]


def test_offline_requests_get_every_sequence_with_or_without_the_prompt():
    llm = FakeLlm([4, 5], ends=False)
    assert run(llm, GenerationRequest([[1], [2, 3]], 2)).events == [("final", [[4, 5], [4, 5]])]
    assert [call[2] for call in llm.calls] == [False, False] and llm.calls[0][1]["max_tokens"] == 2
    kept = run(FakeLlm([4]), GenerationRequest([[1, 2]], 2, exclude_input=False))
    assert kept.events == [("final", [[1, 2, 4]])]


def test_errors_become_the_requests_error():
    failing = run(FakeLlm([4, 5], fail=True), GenerationRequest([[1]], 4))
    assert failing.events == [("error", "TensorRT-LLM: CUDA out of memory", False)]
    too_long = run(FakeLlm([4]), GenerationRequest([list(range(9))], 4))
    assert too_long.events == [("error", "input length 9 exceeds max_input_len 8", False)]


def test_a_cancelled_request_is_aborted():
    llm = FakeLlm([4, 5], hang=True)
    sink = run(llm, GenerationRequest([[1]], 4, streaming=True), Sink(cancel_after=0))
    assert llm.aborted.is_set() and sink.events[-1] == ("error", "the request was cancelled", True)


@pytest.fixture(scope="module")
def qwen05b(trtdeploy_checkpoint, tmp_path_factory):
    return real_sized(trtdeploy_checkpoint, tmp_path_factory, "qwen_llm", QWEN25_05B)


def test_the_plan_has_no_build_step_and_renders_the_llm_api_settings(qwen05b, tmp_path):
    found = plan(qwen05b, tmp_path / "d", engine="trtllm_pytorch", gpu="H100:2", tp=2, max_batch_size=32)
    assert found.steps == [] and found.point.engine_version == "1.2.1"
    configs = build.render_repository(found.templates, tmp_path / "repo")
    text = configs["tensorrt_llm"].read_text()
    assert 'backend: "python"' in text and "trtdeploy.engines.trtllm_pytorch.llmapi:load_from_parameters" in text
    assert 'key: "tensor_parallel_size" value: { string_value: "2" }' in text
    assert 'key: "max_tokens_in_paged_kv_cache" value: { string_value: "98304" }' in text
    assert any("no mpirun ranks" in note for note in found.notes)


def test_quantized_precisions_need_a_modelopt_checkpoint(qwen05b, tmp_path):
    with pytest.raises(UsageError, match="quantized by NVIDIA ModelOpt"):
        plan(qwen05b, tmp_path, engine="trtllm_pytorch", gpu="H100", precision="fp8")
    quantized = tmp_path / "fp8"
    shutil.copytree(qwen05b, quantized)
    (quantized / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    assert plan(quantized, tmp_path, engine="trtllm_pytorch", gpu="H100", precision="fp8").point.precision == "fp8"
    with pytest.raises(UsageError, match="holds fp8 weights"):
        plan(quantized, tmp_path, engine="trtllm_pytorch", gpu="H100", precision="bf16")
    with pytest.raises(UsageError, match="outside what this engine plans for"):
        plan(qwen05b, tmp_path, engine="trtllm_pytorch", gpu="H100", engine_version="0.21.0")
