"""tensorrtllm_backend's own client against the qwen_llm ensemble, on the tiny Qwen2 (torch engine, real tritonserver).

:class:`OfficialClient` sends what ``inflight_batcher_llm/client/end_to_end_grpc_client.py`` (v0.19.0) sends, written
here from what that client does: by default ``text_input``, ``max_tokens`` (100), ``stream``, ``beam_width`` (1),
``temperature`` (1.0) and ``exclude_input_in_output`` (false), asking for ``text_output`` only, over a gRPC stream
whatever ``stream`` says; each flag adds its input (``num_return_sequences``, ``stop_words``, ``bad_words``, the
penalties, ``end_id``, ``pad_id``, ``return_*``, embedding bias words and weights, LoRA and guided-decoding inputs,
several prompts in one batch) and the outputs it then reads (``sequence_index``, ``batch_index``, the log probs,
the logits, the perf metrics). It collects every response's ``text_output[0]`` by ``batch_index`` and
``sequence_index`` (0 when absent), appending streamed pieces, and every error.

The tiny random model repeats one token under greedy decoding ("Hello Triton" → "nnnn…"): the words and ids the
tests use are read from what it actually generates, so each test fails when its input is ignored. ``output_ids``
(which trtdeploy's ensemble adds to the official outputs) is asked for where a check needs the tokens.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

PROMPT = "Hello Triton"
#: What the client asks for with --return-perf-metrics (v0.19.0).
PERF_METRICS = (
    "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
    "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
    "total_accepted_draft_tokens", "total_draft_tokens",
)  # fmt: skip


@dataclass
class Answer:
    """What the client made of the responses to one request."""

    texts: dict[tuple[int, int], str] = field(default_factory=dict)
    results: list = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        assert not self.errors, self.errors
        return self.texts[(0, 0)]

    def ids(self, batch: int = 0, sequence: int = 0) -> list[int]:
        """The token ids of one sequence, from the responses' ``output_ids`` (streamed pieces joined)."""
        found = []
        for result in self.results:
            if _index(result, "batch_index") == batch and _index(result, "sequence_index") == sequence:
                ids, lengths = result.as_numpy("output_ids"), result.as_numpy("sequence_length")
                found += ids[0, 0, : lengths[0, 0]].tolist()
        return found


def _index(result, name: str) -> int:
    values = result.as_numpy(name)
    return 0 if values is None else int(values[0][0])


class OfficialClient:
    """end_to_end_grpc_client.py's requests and its reading of the responses (see the module docstring)."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)

    def request(
        self,
        prompts: str | list[str] = PROMPT,
        *,
        output_len: int = 100,
        streaming: bool = False,
        beam_width: int = 1,
        temperature: float = 1.0,
        num_return_sequences: int | None = None,
        stop_words: list[str] = (),
        bad_words: list[str] = (),
        repetition_penalty: float | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        end_id: int | None = None,
        pad_id: int | None = None,
        return_log_probs: bool = False,
        return_context_logits: bool = False,
        return_generation_logits: bool = False,
        return_perf_metrics: bool = False,
        exclude_input_in_output: bool = False,
        embedding_bias_words: list[str] | None = None,
        embedding_bias_weights: list[float] | None = None,
        lora_task_id: int | None = None,
        guided_decoding_guide_type: str | None = None,
        guided_decoding_guide: str | None = None,
        extra: dict[str, np.ndarray] | None = None,
        extra_outputs: tuple[str, ...] = (),
    ) -> Answer:
        """One run of the client: ``prompts`` a list means ``--batch-inputs`` with a JSON list of prompts; ``extra``
        are inputs the client has no flag for, ``extra_outputs`` outputs it does not read."""
        batch = isinstance(prompts, list)
        rows = prompts if batch else [prompts]
        tensors: dict[str, list[np.ndarray]] = {}
        for prompt in rows:
            inputs = {
                "text_input": np.array([[prompt]], dtype=object),
                "max_tokens": np.array([[output_len]], dtype=np.int32),
                "stream": np.array([[streaming]], dtype=bool),
                "beam_width": np.array([[beam_width]], dtype=np.int32),
                "temperature": np.array([[temperature]], dtype=np.float32),
                "exclude_input_in_output": np.array([[exclude_input_in_output]], dtype=bool),
            }
            flags = {
                "num_return_sequences": (num_return_sequences, np.int32),
                "repetition_penalty": (repetition_penalty, np.float32),
                "presence_penalty": (presence_penalty, np.float32),
                "frequency_penalty": (frequency_penalty, np.float32),
                "end_id": (end_id, np.int32),
                "pad_id": (pad_id, np.int32),
                "lora_task_id": (lora_task_id or None, np.uint64),
                "guided_decoding_guide_type": (guided_decoding_guide_type, object),
                "guided_decoding_guide": (guided_decoding_guide, object),
            }
            for name, flag in (
                ("return_log_probs", return_log_probs),
                ("return_context_logits", return_context_logits),
                ("return_generation_logits", return_generation_logits),
                ("return_perf_metrics", return_perf_metrics),
            ):
                flags[name] = (True if flag else None, bool)
            for name, (value, dtype) in flags.items():
                if value is not None:
                    inputs[name] = np.array([[value]], dtype=dtype)
            for name, words in (("stop_words", stop_words), ("bad_words", bad_words)):
                if words:
                    inputs[name] = np.array([list(words)], dtype=object)
            if embedding_bias_words is not None:
                inputs["embedding_bias_words"] = np.array([embedding_bias_words], dtype=object)
                inputs["embedding_bias_weights"] = np.array([embedding_bias_weights], dtype=np.float32)
            inputs.update(extra or {})
            for name, value in inputs.items():
                tensors.setdefault(name, []).append(value)
        infer_inputs = []
        for name, values in tensors.items():
            value = np.concatenate(values)
            item = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            item.set_data_from_numpy(value)
            infer_inputs.append(item)

        outputs = ["text_output", *extra_outputs]
        if return_log_probs:
            outputs += ["cum_log_probs", "output_log_probs"]
        if return_context_logits:
            outputs.append("context_logits")
        if return_generation_logits:
            outputs.append("generation_logits")
        if num_return_sequences is not None and num_return_sequences > 1:
            outputs.append("sequence_index")
        if batch:
            outputs.append("batch_index")
        if return_perf_metrics:
            outputs += PERF_METRICS

        received: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: received.put(error or result))
        self.client.async_stream_infer(
            "ensemble", infer_inputs, outputs=[grpcclient.InferRequestedOutput(name) for name in outputs]
        )
        self.client.stop_stream()  # waits for the server to close the stream

        answer = Answer()
        while not received.empty():
            result = received.get()
            if isinstance(result, InferenceServerException):
                answer.errors.append(result.message())
                continue
            answer.results.append(result)
            key = (_index(result, "batch_index"), _index(result, "sequence_index"))
            text = result.as_numpy("text_output")[0].decode("utf-8")
            answer.texts[key] = answer.texts.get(key, "") + text if streaming else text
        return answer


@pytest.fixture(scope="module", params=["offline", "streaming"])
def served(request, trtdeploy_deploy, trtdeploy_serve):
    """The client's default max_tokens (100) fits these deployments (a folder of their own: ``variant``)."""
    deployment = trtdeploy_deploy(
        "qwen_llm", mode=request.param, max_input_len=64, max_output_len=100, variant="official-client"
    )
    return request.param, deployment, OfficialClient(trtdeploy_serve(deployment).grpc_url)


@pytest.fixture(scope="module")
def tokenizer(served):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(served[1].llm_dir))


@pytest.fixture(scope="module")
def greedy(served):
    """The greedy answer to PROMPT: ids and text, without the prompt."""
    _, _, client = served
    answer = client.request(exclude_input_in_output=True, extra_outputs=("output_ids", "sequence_length"))
    return answer.ids(), answer.text


def test_the_default_request_is_answered_with_the_prompt_and_greedy_tokens(served, tokenizer, greedy):
    _, deployment, client = served
    answer = client.request()
    ids, text = greedy
    assert len(ids) == 100 and text  # no end token: the tiny model repeats itself
    assert answer.text == PROMPT + text  # exclude_input_in_output false: the prompt first, as upstream
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(deployment.llm_dir)).eval()
    prompt = tokenizer(PROMPT)["input_ids"]
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=100, do_sample=False, pad_token_id=0)
    assert ids == expected[0, len(prompt) :].tolist()


def test_streaming_gives_the_same_text(served, greedy):
    mode, _, client = served
    if mode == "offline":
        answer = client.request(streaming=True)
        assert len(answer.errors) == 1 and "streaming=true needs a decoupled model" in answer.errors[0]
        return
    answer = client.request(streaming=True)
    assert len(answer.results) > 1  # tokens as they come (the prompt is never streamed)
    assert answer.text == greedy[1]


def test_stop_words_end_the_text_on_the_word(served, greedy, tokenizer):
    _, _, client = served
    ids, _ = greedy
    word = tokenizer.decode(ids[:2])  # two tokens of what greedy decoding says
    assert tokenizer.encode(word, add_special_tokens=False) == ids[:2]
    # TRT-LLM matches stop words on the prompt followed by the output: the first place the word ends
    sequence = tokenizer(PROMPT)["input_ids"] + ids
    generated = next(
        end for end in range(1, len(ids) + 1) if sequence[len(sequence) - len(ids) + end - 2 :][:2] == ids[:2]
    )
    for streaming in (False, True) if served[0] == "streaming" else (False,):
        answer = client.request(stop_words=[word, "never said"], streaming=streaming, exclude_input_in_output=True)
        assert answer.text == tokenizer.decode(ids[:generated])  # the stop word stays in the output, as in TRT-LLM
        assert len(answer.text) < 100


def test_bad_words_never_appear(served, greedy, tokenizer):
    _, _, client = served
    ids, text = greedy
    banned = tokenizer.decode(ids[:1])
    outputs = ("output_ids", "sequence_length")
    answer = client.request(bad_words=[banned], exclude_input_in_output=True, extra_outputs=outputs)
    assert ids[0] not in answer.ids() and len(answer.ids()) == 100
    assert banned not in answer.text


def test_end_id_and_min_length(served, greedy):
    _, _, client = served
    ids, _ = greedy
    stopped = client.request(
        end_id=ids[0], exclude_input_in_output=True, extra_outputs=("output_ids", "sequence_length")
    )
    assert stopped.ids() == [] and stopped.text == ""
    held = client.request(
        end_id=ids[0],
        exclude_input_in_output=True,
        extra={"min_tokens": np.array([[5]], dtype=np.int32)},  # no flag for it in the client
        extra_outputs=("output_ids", "sequence_length"),
    )
    assert len(held.ids()) >= 5 and ids[0] not in held.ids()


def test_penalties(served, greedy):
    _, _, client = served
    ids, _ = greedy
    assert len(set(ids)) < 5  # greedy decoding repeats itself
    outputs = ("output_ids", "sequence_length")
    for flag in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = 1e6 if flag == "repetition_penalty" else 100.0
        penalised = client.request(output_len=20, exclude_input_in_output=True, extra_outputs=outputs, **{flag: value})
        assert len(set(penalised.ids())) == 20, flag  # a token once seen is never chosen again


def test_return_sequences(served, greedy):
    mode, _, client = served
    if mode == "offline":  # one response per request there (as upstream): refused by name, no sequence lost
        refused = client.request(num_return_sequences=2, output_len=8)
        assert refused.texts == {} and len(refused.errors) == 1
        assert "num_return_sequences 2 needs a decoupled model (deploy with --mode streaming)" in refused.errors[0]
        return
    copies = client.request(num_return_sequences=2, output_len=8, exclude_input_in_output=True)
    sampled = client.request(
        num_return_sequences=2,
        output_len=8,
        exclude_input_in_output=True,
        extra={"top_p": np.array([[0.9]], np.float32)},
        extra_outputs=("output_ids", "sequence_length"),
    )
    # each sequence in its own responses, tagged with its sequence_index
    assert copies.texts == {(0, 0): greedy[1][:8], (0, 1): greedy[1][:8]}  # greedy: TRT-LLM's copies
    # told apart by their ids: the texts of a random model's tokens can be equal (ids that decode to nothing)
    assert sampled.texts.keys() == {(0, 0), (0, 1)} and sampled.ids(0, 0) != sampled.ids(0, 1)


def test_log_probs_and_logits(served, greedy, tokenizer):
    _, deployment, client = served
    ids, _ = greedy
    answer = client.request(
        output_len=6, return_log_probs=True, return_context_logits=True, return_generation_logits=True
    )
    (result,) = [r for r in answer.results if r.as_numpy("generation_logits") is not None]
    assert result.as_numpy("output_log_probs").tolist() == [[[0.0] * 6]]  # greedy: probability 1, as in TRT-LLM
    assert result.as_numpy("cum_log_probs").tolist() == [[0.0]]
    prompt = tokenizer(PROMPT)["input_ids"]
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(deployment.llm_dir)).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids[:6]])).logits[0]
    np.testing.assert_allclose(result.as_numpy("context_logits")[0], logits[: len(prompt)], atol=1e-4)
    generation = result.as_numpy("generation_logits")
    assert generation.shape == (1, 1, 6, logits.shape[-1])
    np.testing.assert_allclose(generation[0, 0], logits[len(prompt) - 1 : -1], atol=1e-4)
    sampled = client.request(
        output_len=6,
        return_log_probs=True,
        extra={"top_p": np.array([[0.9]], np.float32), "seed": np.array([[3]], np.uint64)},
    )
    log_probs = [r.as_numpy("output_log_probs") for r in sampled.results if r.as_numpy("output_log_probs") is not None]
    values = np.concatenate([value.reshape(-1) for value in log_probs])
    cum = [r.as_numpy("cum_log_probs") for r in sampled.results if r.as_numpy("cum_log_probs") is not None][-1]
    assert len(values) == 6 and np.all(values < 0) and cum.reshape(-1)[0] == pytest.approx(values.sum(), rel=1e-5)


def test_an_embedding_bias_steers_the_choice(served, tokenizer):
    _, _, client = served
    answer = client.request(
        output_len=8, exclude_input_in_output=True, embedding_bias_words=["x", "z"], embedding_bias_weights=[100.0, 0.5]
    )
    assert answer.text == "x" * 8


def test_several_prompts_in_one_batch(served, greedy):
    mode, _, client = served
    other = "The quick brown fox"
    if mode == "offline":  # as upstream, where a batch needs a decoupled model: refused by name, no text lost
        refused = client.request([PROMPT, other], output_len=8)
        assert refused.texts == {} and len(refused.errors) == 1
        assert "input_ids with 2 prompts needs a decoupled model (deploy with --mode streaming)" in refused.errors[0]
        return
    alone = client.request(other, output_len=8, exclude_input_in_output=True).text
    both = client.request([PROMPT, other], output_len=8, exclude_input_in_output=True)
    assert both.texts == {(0, 0): greedy[1][:8], (1, 0): alone}  # one response per prompt, tagged with batch_index
    ended = client.request([PROMPT, other], output_len=8, end_id=greedy[0][0], exclude_input_in_output=True)
    assert ended.texts[(0, 0)] == "" and ended.texts[(1, 0)]  # the first prompt ends at once, the other goes on


def test_a_temperature_alone_still_decodes_greedily(served, greedy):
    _, _, client = served
    # as in TRT-LLM: with top_k and top_p both 0 (unset), the temperature does not make a request sample
    assert client.request(output_len=8, temperature=0.5, exclude_input_in_output=True).text == greedy[1][:8]


def test_token_counts_come_when_asked(served, tokenizer):
    _, _, client = served
    flags = {name: np.array([[True]]) for name in ("return_num_input_tokens", "return_num_output_tokens")}
    answer = client.request(output_len=8, extra=flags, extra_outputs=("num_input_tokens", "num_output_tokens"))
    counted = [result for result in answer.results if result.as_numpy("num_input_tokens") is not None]
    assert {int(result.as_numpy("num_input_tokens")[0, 0]) for result in counted} == {
        len(tokenizer(PROMPT)["input_ids"])
    }
    assert sum(int(result.as_numpy("num_output_tokens")[0, 0]) for result in counted) == 8


def test_what_the_torch_engine_cannot_do_is_refused_by_name(served):
    _, _, client = served
    refused = {
        "beam_width 2: the torch engine decodes one beam (beam_width 1)": {"beam_width": 2},
        "return_perf_metrics true: the torch engine keeps no per-request KV-cache or timing metrics": {
            "return_perf_metrics": True
        },
        "lora_task_id: the torch engine of this deployment does not take it": {"lora_task_id": 3},
        "guided_decoding_guide, guided_decoding_guide_type: the torch engine of this deployment does not take them": {
            "guided_decoding_guide_type": "json",
            "guided_decoding_guide": "{}",
        },
        "length_penalty (len_penalty) 2: it scores beam search": {
            "extra": {"length_penalty": np.array([[2.0]], np.float32)}
        },
    }
    for message, flags in refused.items():
        answer = client.request(output_len=4, **flags)
        assert len(answer.errors) == 1 and message in answer.errors[0], (flags, answer.errors)
        assert answer.texts == {}


def test_neutral_values_are_accepted(served, greedy):
    _, _, client = served
    neutral = {
        "length_penalty": np.array([[1.0]], np.float32),
        "return_perf_metrics": np.array([[False]]),
        "return_context_logits": np.array([[False]]),
        "lora_task_id": np.array([[0]], np.uint64),
        "guided_decoding_guide_type": np.array([[""]], dtype=object),
        "prompt_vocab_size": np.array([[0]], np.int32),
        "stop_words": np.array([[""]], dtype=object),
        "min_tokens": np.array([[0]], np.int32),
        "num_return_sequences": np.array([[1]], np.int32),
        "decoder_text_input": np.array([[""]], dtype=object),
    }
    # pad_id has nothing to pad: a response holds one sequence of one beam
    answer = client.request(output_len=8, exclude_input_in_output=True, pad_id=5, extra=neutral)
    assert answer.text == greedy[1][:8]


def test_the_ensemble_declares_the_official_tensors(served):
    _, _, client = served
    config = client.client.get_model_config("ensemble", as_json=True)["config"]
    names = [tensor["name"] for tensor in config["input"]]
    assert names == list(OFFICIAL_INPUTS)  # the newest set, in its order
    outputs = {tensor["name"] for tensor in config["output"]}
    assert {"text_output", "cum_log_probs", "batch_index", "sequence_index", *PERF_METRICS} <= outputs


#: The inputs of the official ensemble of TensorRT-LLM 1.0 (the v0.19.0 set with seed/min_tokens, and the token
#: counts' switches).
OFFICIAL_INPUTS = (
    "text_input", "decoder_text_input", "max_tokens", "num_return_sequences", "bad_words", "stop_words",
    "exclude_input_in_output", "end_id", "pad_id", "top_k", "top_p", "temperature", "length_penalty",
    "repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty", "seed", "return_log_probs",
    "return_context_logits", "return_generation_logits", "return_perf_metrics", "return_num_input_tokens",
    "return_num_output_tokens", "beam_width", "stream", "prompt_embedding_table", "prompt_table_extra_id",
    "prompt_vocab_size", "embedding_bias_words", "embedding_bias_weights", "lora_task_id", "lora_weights",
    "lora_config", "guided_decoding_guide_type", "guided_decoding_guide",
)  # fmt: skip
