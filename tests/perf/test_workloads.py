"""The LLM workloads without a server: the tensors they build and how they read responses."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from trtdeploy.errors import UsageError
from trtdeploy.perf.llm import TextLLMWorkload, TokenLLMWorkload, load_tokenizer
from trtdeploy.perf.transports import model_info_from_config
from trtdeploy.perf.workload import InputRow, ModelInfo, RequestOptions, TensorSpec


def _specs(*entries: tuple[str, str]) -> dict[str, TensorSpec]:
    return {name: TensorSpec(name, datatype, (1,), optional=True) for name, datatype in entries}


ENSEMBLE = ModelInfo(
    name="ensemble",
    inputs=_specs(("text_input", "BYTES"), ("max_tokens", "INT32"), ("stream", "BOOL"), ("end_id", "INT32")),
    outputs=_specs(("text_output", "BYTES"), ("output_ids", "INT32")),
    max_batch_size=8,
)
LLM = ModelInfo(
    name="tensorrt_llm",
    inputs=_specs(
        ("input_ids", "INT32"),
        ("input_lengths", "INT32"),
        ("request_output_len", "INT32"),
        ("streaming", "BOOL"),
        ("temperature", "FP32"),
        ("random_seed", "UINT64"),
    ),
    outputs=_specs(("output_ids", "INT32"), ("sequence_length", "INT32")),
    max_batch_size=8,
)


def test_text_request_tensors(tiny_tokenizer):
    workload = TextLLMWorkload("ensemble", tiny_tokenizer, max_tokens=32)
    options = RequestOptions(stream=True, ignore_eos=True)
    workload.validate(ENSEMBLE, options)
    request = workload.make_request(InputRow("hello world", reference="hi"), options, ENSEMBLE)
    assert request.inputs["text_input"].shape == (1, 1) and request.inputs["text_input"][0, 0] == b"hello world"
    assert request.inputs["max_tokens"].dtype == np.int32 and request.inputs["max_tokens"][0, 0] == 32
    assert request.inputs["stream"].dtype == np.bool_ and request.inputs["stream"][0, 0]
    assert request.inputs["end_id"][0, 0] == -1
    assert request.outputs == ("text_output", "output_ids")
    assert request.input_tokens == len(load_tokenizer(tiny_tokenizer).encode("hello world"))
    assert request.reference == "hi"


def test_row_and_option_lengths_override_the_default(tiny_tokenizer):
    workload = TextLLMWorkload("ensemble", tiny_tokenizer, max_tokens=32)
    assert workload.make_request(InputRow("a"), RequestOptions(max_tokens=7), ENSEMBLE).inputs["max_tokens"] == 7
    row = InputRow("a", max_tokens=3)
    assert workload.make_request(row, RequestOptions(max_tokens=7), ENSEMBLE).inputs["max_tokens"] == 3


def test_sampling_inputs_under_either_name(tiny_tokenizer):
    options = RequestOptions(top_k=5, top_p=0.9)
    ensemble = ModelInfo(
        "ensemble", {**ENSEMBLE.inputs, **_specs(("top_k", "INT32"), ("top_p", "FP32"))}, ENSEMBLE.outputs, 8
    )
    request = TextLLMWorkload("ensemble", tiny_tokenizer).make_request(InputRow("a"), options, ensemble)
    assert request.inputs["top_k"].tolist() == [[5]] and "runtime_top_k" not in request.inputs
    llm = ModelInfo("tensorrt_llm", {**LLM.inputs, **_specs(("runtime_top_k", "INT32"))}, LLM.outputs, 8)
    request = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer).make_request(InputRow("a"), RequestOptions(top_k=3), llm)
    assert request.inputs["runtime_top_k"].tolist() == [[3]]
    with pytest.raises(UsageError, match="has no input 'top_k', 'top_p'"):
        TextLLMWorkload("ensemble").validate(ENSEMBLE, options)


def test_options_the_model_cannot_take_are_refused():
    workload = TextLLMWorkload("ensemble")
    with pytest.raises(UsageError, match="has no input 'temperature'"):
        workload.validate(ENSEMBLE, RequestOptions(temperature=0.5))
    with pytest.raises(UsageError, match="has no input 'text_input'"):
        workload.validate(LLM, RequestOptions())


def test_text_counts_server_ids_else_retokenizes(tiny_tokenizer):
    workload = TextLLMWorkload("ensemble", tiny_tokenizer)
    request = workload.make_request(InputRow("x"), RequestOptions(), ENSEMBLE)
    with_ids = [
        workload.parse_chunk(
            {"text_output": np.array([[text.encode()]], dtype=object), "output_ids": np.array([ids], dtype=np.int32)},
            request,
        )
        for text, ids in (("hello", [5, 6]), (" world", [7]))
    ]
    result = workload.finish(request, with_ids)
    assert (result.output_tokens, result.first_chunk_tokens, result.token_source) == (3, 2, "server")
    assert result.text == "hello world"

    texts = [workload.parse_chunk({"text_output": np.array([[t]], dtype=object)}, request) for t in (b"hello", b" dog")]
    assert texts[0].tokens is None
    result = workload.finish(request, texts)
    tokenizer = load_tokenizer(tiny_tokenizer)
    assert result.token_source == "retokenized"
    assert result.output_tokens == len(tokenizer.encode("hello dog", add_special_tokens=False))
    assert result.first_chunk_tokens == len(tokenizer.encode("hello", add_special_tokens=False))


def test_token_request_and_prompt_stripping(tiny_tokenizer):
    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    options = RequestOptions(max_tokens=4, temperature=0.7, seed=3)
    workload.validate(LLM, options)
    request = workload.make_request(InputRow("the quick fox", reference="the"), options, LLM)
    prompt = load_tokenizer(tiny_tokenizer).encode("the quick fox")
    assert request.inputs["input_ids"].tolist() == [prompt]
    assert request.inputs["input_lengths"].tolist() == [[len(prompt)]]
    assert request.inputs["request_output_len"].tolist() == [[4]]
    assert request.inputs["temperature"].dtype == np.float32
    assert request.inputs["random_seed"].dtype == np.uint64
    assert request.input_tokens == len(prompt)

    generated = prompt[:2]
    # offline, TRT-LLM style: prompt + generated ids, padded, trimmed by sequence_length
    padded = np.array([[prompt + generated + [0, 0]]], dtype=np.int32)
    chunk = workload.parse_chunk(
        {"output_ids": padded, "sequence_length": np.array([[len(prompt) + 2]], dtype=np.int32)}, request
    )
    assert chunk.tokens == 2
    result = workload.finish(request, [chunk])
    assert (result.output_tokens, result.token_source) == (2, "server")
    assert result.text == load_tokenizer(tiny_tokenizer).decode(generated)


def test_model_info_from_grpc_and_http_configs():
    grpc_json = {
        "name": "m",
        "max_batch_size": 8,
        "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": ["1"], "optional": True}],
        "output": [{"name": "output_ids", "data_type": "TYPE_INT32", "dims": ["-1", "-1"]}],
        "model_transaction_policy": {"decoupled": True},
    }
    info = model_info_from_config(grpc_json)
    assert info.inputs["text_input"] == TensorSpec("text_input", "BYTES", (1,), optional=True)
    assert info.outputs["output_ids"].dims == (-1, -1)
    assert info.decoupled and info.shape(3) == [1, 3]
    http_json = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    assert model_info_from_config(http_json).shape(3) == [3]


def test_workloads_pickle_without_their_tokenizer(tiny_tokenizer):
    workload = TextLLMWorkload("ensemble", tiny_tokenizer)
    workload.tokenizer  # noqa: B018 - loads it
    copy = pickle.loads(pickle.dumps(workload))
    assert copy._tokenizer is None and copy.tokenizer_dir == workload.tokenizer_dir


def test_retarget_keeps_everything_but_the_model():
    workload = TextLLMWorkload("ensemble", None, decoupled=True, max_tokens=9)
    other = workload.retarget("tensorrt_llm_bls")
    assert (other.model_name, other.decoupled, other.max_tokens) == ("tensorrt_llm_bls", True, 9)
    assert workload.model_name == "ensemble"
