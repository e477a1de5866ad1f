"""The LLM workloads without a server: the tensors they build and how they read responses."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from trtdeploy.errors import UsageError
from trtdeploy.perf.control import model_info_from_config
from trtdeploy.perf.llm import TextLLMWorkload, TokenLLMWorkload, load_tokenizer
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
        ("runtime_top_p", "FP32"),
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


def _text_chunk(workload, request, text, ids=None):
    outputs = {"text_output": np.array([[text.encode()]], dtype=object)}
    if ids is not None:
        outputs["output_ids"] = np.array([ids], dtype=np.int32)
    return workload.parse_chunk(outputs, request)


def test_text_counts_server_ids_else_retokenizes(tiny_tokenizer):
    workload = TextLLMWorkload("ensemble", tiny_tokenizer)
    tokenizer = load_tokenizer(tiny_tokenizer)
    request = workload.make_request(InputRow("x"), RequestOptions(), ENSEMBLE)
    hello, world = tokenizer.encode("hello", add_special_tokens=False), tokenizer.encode(" world")
    with_ids = [_text_chunk(workload, request, "hello", hello), _text_chunk(workload, request, " world", world)]
    result = workload.finish(request, with_ids)
    assert result.token_source == "server"
    assert (result.output_tokens, result.first_chunk_tokens) == (len(hello) + len(world), len(hello))
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
    assert request.inputs["runtime_top_p"].tolist() == [[1.0]]  # temperature alone samples: top_p 1
    assert request.inputs["random_seed"].dtype == np.uint64
    assert request.input_tokens == len(prompt)

    assert "exclude_input_in_output" not in request.inputs  # the model does not take it: it echoes the prompt
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


def test_temperature_alone_needs_a_top_p_input(tiny_tokenizer):
    no_top_p = ModelInfo("tensorrt_llm", {k: v for k, v in LLM.inputs.items() if k != "runtime_top_p"}, LLM.outputs, 8)
    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    with pytest.raises(UsageError, match="has no input 'top_p': with top_k and top_p off") as caught:
        workload.validate(no_top_p, RequestOptions(temperature=0.7))
    assert "--top-k" in caught.value.hint
    workload.validate(no_top_p, RequestOptions(temperature=0.0))  # greedy: nothing to sample with


def test_zero_token_answers_are_successes_with_no_tokens(tiny_tokenizer):
    text = TextLLMWorkload("ensemble", tiny_tokenizer)
    request = text.make_request(InputRow("x"), RequestOptions(), ENSEMBLE)
    for shape in ((1, 1, 0), (1, 0), (0,)):  # offline: the whole (empty) answer in one response
        outputs = {"text_output": np.array([[b""]], dtype=object), "output_ids": np.zeros(shape, dtype=np.int32)}
        chunk = text.parse_chunk(outputs, request)
        assert (chunk.tokens, chunk.has_content) == (0, False)
    result = text.finish(request, [])  # no chunk with content (streamed: the final flag alone)
    assert (result.output_tokens, result.first_chunk_tokens, result.token_source) == (0, None, "server")
    assert result.text == ""
    no_ids = ModelInfo("ensemble", ENSEMBLE.inputs, _specs(("text_output", "BYTES")), 8)
    request = text.make_request(InputRow("x"), RequestOptions(), no_ids)
    assert text.finish(request, []).output_tokens == 0
    assert text.finish(request, []).token_source == "retokenized"

    token = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    excluding = ModelInfo("tensorrt_llm", {**LLM.inputs, **_specs(("exclude_input_in_output", "BOOL"))}, LLM.outputs, 8)
    request = token.make_request(InputRow("x", reference="y"), RequestOptions(), excluding)
    outputs = {"output_ids": np.zeros((1, 1, 0), dtype=np.int32), "sequence_length": np.array([[0]], dtype=np.int32)}
    chunk = token.parse_chunk(outputs, request)
    assert (chunk.tokens, chunk.has_content) == (0, False)
    result = token.finish(request, [])
    assert (result.output_tokens, result.first_chunk_tokens, result.token_source) == (0, None, "server")


def test_the_prompt_is_stripped_only_where_the_model_echoes_it(tiny_tokenizer):
    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    prompt = load_tokenizer(tiny_tokenizer).encode("!")
    generated = prompt * 4  # the answer repeats the prompt: only its length may tell them apart
    excluding = ModelInfo("tensorrt_llm", {**LLM.inputs, **_specs(("exclude_input_in_output", "BOOL"))}, LLM.outputs, 8)

    def tokens(model, ids, *, stream=False):
        request = workload.make_request(InputRow("!"), RequestOptions(max_tokens=4, stream=stream), model)
        return workload.parse_chunk({"output_ids": np.array([[ids]], dtype=np.int32)}, request).tokens

    request = workload.make_request(InputRow("!"), RequestOptions(), excluding)
    assert request.inputs["exclude_input_in_output"].tolist() == [[True]]
    assert tokens(excluding, generated) == 4  # asked to exclude the prompt: every id is generated
    assert tokens(LLM, prompt + generated) == 4  # offline without the input: the prompt's length dropped
    assert tokens(LLM, generated[:1], stream=True) == 1  # streamed responses never hold the prompt
    with pytest.raises(ValueError, match="fewer than the"):
        tokens(LLM, [], stream=False)


def test_text_is_decoded_from_all_the_ids_at_once(tiny_tokenizer):
    """A character whose bytes span tokens: decoded piece by piece (as the server streams it) it is U+FFFD."""
    tokenizer = load_tokenizer(tiny_tokenizer)
    ids = tokenizer.encode("好 ok", add_special_tokens=False)
    assert len(tokenizer.encode("好", add_special_tokens=False)) > 1
    pieces = [tokenizer.decode([token]) for token in ids]
    assert "\ufffd" in "".join(pieces)
    workload = TextLLMWorkload("ensemble", tiny_tokenizer)
    request = workload.make_request(InputRow("x", reference="好 ok"), RequestOptions(stream=True), ENSEMBLE)
    chunks = [_text_chunk(workload, request, piece, [token]) for piece, token in zip(pieces, ids, strict=True)]
    result = workload.finish(request, chunks)
    assert result.text == "好 ok" and result.output_tokens == len(ids)
    # without ids (or without a tokenizer) the pieces are all there is
    no_ids = [_text_chunk(workload, request, piece) for piece in pieces]
    assert workload.finish(request, no_ids).text == "".join(pieces)
    bare = TextLLMWorkload("ensemble")
    assert bare.finish(request, chunks).text == "".join(pieces)
