"""The trtllm_pytorch engine: its plan and rendered model, and the contract adapter over TensorRT-LLM's LLM API.

TensorRT-LLM cannot be installed here: the adapter is driven by a stand-in with the LLM API's shape
(:class:`~.contract_helpers.FakeLlm`), which checks our side only.
"""

from __future__ import annotations

import json
import shutil

import pytest

from trtdeploy import build
from trtdeploy.engines.contract import NEVER_STOP, GenerationRequest, SamplingParams
from trtdeploy.engines.trtllm_pytorch.llmapi import sampling_arguments
from trtdeploy.errors import UsageError

from .contract_helpers import END, PAD, FakeLlm, RecordingSink, run_on_llm_api
from .trtllm_helpers import QWEN25_05B, plan, real_sized


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


def test_streaming_sends_each_new_piece_and_never_the_end_token():
    sink = run_on_llm_api(FakeLlm([4, 5, 6]), GenerationRequest([[1, 2]], 8, streaming=True))
    assert sink.streamed == [[4], [5], [6]] and sink.outputs is None and sink.finals == 1


def test_offline_requests_get_every_sequence_with_or_without_the_prompt():
    llm = FakeLlm([4, 5], ends=False)
    assert run_on_llm_api(llm, GenerationRequest([[1], [2, 3]], 2)).outputs == [[4, 5], [4, 5]]
    assert [call[2] for call in llm.calls] == [False, False] and llm.calls[0][1]["max_tokens"] == 2
    kept = run_on_llm_api(FakeLlm([4]), GenerationRequest([[1, 2]], 2, exclude_input=False))
    assert kept.outputs == [[1, 2, 4]] and kept.outputs[0].prompt_tokens == 2


def test_errors_become_the_requests_error():
    failing = run_on_llm_api(FakeLlm([4, 5], fail=True), GenerationRequest([[1]], 4))
    assert failing.error == "TensorRT-LLM: CUDA out of memory" and not failing.cancelled_error
    too_long = run_on_llm_api(FakeLlm([4]), GenerationRequest([list(range(9))], 4))
    assert too_long.error == "input length 9 exceeds max_input_len 8"


def test_a_cancelled_request_is_aborted():
    llm = FakeLlm([4, 5], hang=True)
    sink = run_on_llm_api(llm, GenerationRequest([[1]], 4, streaming=True), RecordingSink(cancel_after=0))
    assert llm.aborted.is_set() and sink.error == "the request was cancelled" and sink.cancelled_error


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
