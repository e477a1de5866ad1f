"""Each family end to end on the real tritonserver (torch engine, CPU): Llama 3.x (byte-level BPE, Llama 3.2's rope
scaling), Llama 2 (sentencepiece) served by the same llama_llm, and Mistral (sentencepiece). The streamed text is the
text answered in one response, and both are transformers' greedy answer."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from trtdeploy import build
from trtdeploy.checkpoints import write_random_causal_lm

pytestmark = pytest.mark.server

PROMPT = "The quick brown fox"
LIMITS = {"mode": "streaming", "max_input_len": 64, "max_output_len": 32}


def ask(server, prompt: str, max_tokens: int, *, stream: bool) -> tuple[list[str], list[int]]:
    """The texts of the ensemble's responses to one request on the gRPC stream, and the token ids they carry."""

    def tensor(name, array, dtype):
        item = grpcclient.InferInput(name, list(array.shape), dtype)
        item.set_data_from_numpy(array)
        return item

    inputs = [
        tensor("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
        tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        tensor("stream", np.array([[stream]], dtype=bool), "BOOL"),
    ]
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("text_output", "output_ids", "sequence_length")]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer("ensemble", inputs, outputs=outputs, enable_empty_final_response=True)
        texts, ids = [], []
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            if result.as_numpy("text_output") is not None:
                texts.append(result.as_numpy("text_output")[0].decode())
                length = result.as_numpy("sequence_length")[0, 0]
                ids += result.as_numpy("output_ids")[0, 0, :length].tolist()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return texts, ids
    finally:
        client.stop_stream()


def greedy(llm_dir, prompt: str, max_tokens: int) -> tuple[list[int], str]:
    """transformers' greedy answer (as the preprocessing encodes the prompt, up to the EOS) and its text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(llm_dir))
    model = AutoModelForCausalLM.from_pretrained(str(llm_dir)).eval()
    prompt_ids = tokenizer(prompt)["input_ids"]
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    answer = out[0, len(prompt_ids) :].tolist()
    answer = answer[:-1] if answer and answer[-1] == tokenizer.eos_token_id else answer
    return answer, tokenizer.decode(answer, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module")
def llama2_deployment(tmp_path_factory):
    """llama_llm built from a Llama 2 checkpoint: LlamaForCausalLM with a sentencepiece tokenizer."""
    root = tmp_path_factory.mktemp("llama2")
    write_random_causal_lm(root / "checkpoint", architecture="LlamaForCausalLM", tokenizer="llama")
    request = build.BuildRequest(
        model="llama_llm", model_dir=root / "checkpoint", output_root=root / "deployments", gpu="cpu", **LIMITS
    )
    return build.run(request).deployment


def check_family(deployment, server, bos: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(deployment.llm_dir))
    assert tokenizer.convert_ids_to_tokens(tokenizer(PROMPT)["input_ids"])[0] == bos  # the family's tokenizer
    texts, ids = ask(server, PROMPT, 24, stream=True)
    whole, whole_ids = ask(server, PROMPT, 24, stream=False)
    expected_ids, expected_text = greedy(deployment.llm_dir, PROMPT, 24)
    assert len(texts) > 1 and len(whole) == 1
    assert ids == whole_ids == expected_ids
    assert "".join(texts) == whole[0] == expected_text


def test_llama3(trtdeploy_deploy, trtdeploy_serve):
    deployment = trtdeploy_deploy("llama_llm", **LIMITS)
    check_family(deployment, trtdeploy_serve(deployment), "<|begin_of_text|>")


def test_llama2_sentencepiece(llama2_deployment, trtdeploy_serve):
    check_family(llama2_deployment, trtdeploy_serve(llama2_deployment), "<s>")


def test_mistral(trtdeploy_deploy, trtdeploy_serve):
    deployment = trtdeploy_deploy("mistral_llm", **LIMITS)
    check_family(deployment, trtdeploy_serve(deployment), "<s>")
