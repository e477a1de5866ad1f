"""qwen_llm: checkpoint checks, rendering, and the real pipeline (preprocessing → torch engine → postprocessing)."""

from __future__ import annotations

import json
import queue
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from trtdeploy import UsageError
from trtdeploy.plugins import get_model


@pytest.fixture(scope="module")
def spec():
    return get_model("qwen_llm")


def test_validate_checkpoint_names_what_is_wrong(spec, trtdeploy_checkpoint, tmp_path):
    good = trtdeploy_checkpoint("qwen_llm")
    spec.validate_checkpoint(good)
    no_weights = tmp_path / "no_weights"
    shutil.copytree(good, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(UsageError, match="no \\*.safetensors"):
        spec.validate_checkpoint(no_weights)
    llama = tmp_path / "llama"
    shutil.copytree(good, llama)
    config = json.loads((llama / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UsageError, match="is a LlamaForCausalLM, not one of Qwen2ForCausalLM, Qwen3ForCausalLM"):
        spec.validate_checkpoint(llama)


def test_options_are_typed_and_rendered(trtdeploy_deploy):
    deployment = trtdeploy_deploy("qwen_llm", mode="offline", options={"chat_template": "true"})
    config = (deployment.model_repo / "preprocessing" / "config.pbtxt").read_text()
    assert 'key: "chat_template" value: { string_value: "true" }' in config
    assert dict(deployment.point.options)["chat_template"] is True
    workload = get_model("qwen_llm").workload(deployment)  # perf counts input tokens as the preprocessing does
    assert workload.chat_template is True and workload.add_special_tokens is True


def text_inputs(text: bytes, max_tokens: int, *, end_id: int | None = None, stream: bool | None = None):
    def tensor(name, array, dtype):
        item = grpcclient.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        return item

    inputs = [
        tensor("text_input", np.array([[text]], dtype=object), "BYTES"),
        tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
    ]
    if end_id is not None:
        inputs.append(tensor("end_id", np.array([[end_id]], dtype=np.int32), "INT32"))
    if stream is not None:
        inputs.append(tensor("stream", np.array([[stream]], dtype=bool), "BOOL"))
    return inputs


@pytest.fixture(scope="module")
def offline_server(trtdeploy_deploy, trtdeploy_serve):
    deployment = trtdeploy_deploy("qwen_llm", mode="offline", max_input_len=64, max_output_len=32)
    return deployment, trtdeploy_serve(deployment)


def test_offline_ensemble_returns_text_and_exact_token_counts(offline_server):
    deployment, server = offline_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("ensemble", text_inputs(b"Hello Triton", 12, end_id=-1))
    ids = result.as_numpy("output_ids")
    assert ids.shape == (1, 1, 12)
    assert result.as_numpy("sequence_length")[0, 0] == 12
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(deployment.llm_dir))
    expected = tokenizer.decode(ids[0, 0], skip_special_tokens=True)
    assert result.as_numpy("text_output")[0].decode() == expected  # [1], as the official postprocessing sends it


@pytest.mark.parametrize(
    ("text", "max_tokens", "message"),
    [
        (b"", 4, "text_input is empty"),
        (b"\xff\xfe broken", 4, "not valid UTF-8"),
        (b"word " * 200, 4, "more than max_input_len=64"),
        (b"Hello", 0, "max_tokens must be >= 1"),
        (b"Hello", 33, "more than this deployment's max_output_len=32"),
    ],
)
def test_bad_requests_get_error_responses_and_the_server_keeps_serving(offline_server, text, max_tokens, message):
    _, server = offline_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match=message):
        client.infer("ensemble", text_inputs(text, max_tokens))
    assert client.infer("ensemble", text_inputs(b"still alive?", 2, end_id=-1)).as_numpy("output_ids").shape[-1] == 2


def test_streaming_ensemble_sends_tokens_as_they_come(trtdeploy_deploy, trtdeploy_serve):
    deployment = trtdeploy_deploy("qwen_llm", mode="streaming", max_input_len=64, max_output_len=32)
    server = trtdeploy_serve(deployment)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(
            "ensemble", text_inputs(b"Stream me", 6, end_id=-1, stream=True), enable_empty_final_response=True
        )
        chunks = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if result.as_numpy("output_ids") is not None:
                chunks.append(result.as_numpy("output_ids")[0, 0].tolist())
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    assert sum(len(chunk) for chunk in chunks) == 6 and len(chunks) > 1 and all(chunks)
