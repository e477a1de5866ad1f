"""The trtllm_pytorch engine's mapping of the contract's inputs onto TensorRT-LLM's LLM API, and its refusals.

TensorRT-LLM cannot be installed here: the LLM API is stood in for by :class:`~.contract_helpers.FakeLlm`, of its
shape; the field names are TensorRT-LLM 1.0's ``sampling_params.py`` and ``executor/result.py``. This checks our
side only.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtdeploy.engines.contract import GenerationRequest, SamplingParams
from trtdeploy.engines.trtllm_pytorch.llmapi import sampling_arguments

from .contract_helpers import END, PAD, VOCAB, FakeLlm, run_on_llm_api


def test_every_input_maps_onto_a_sampling_params_field():
    torch = pytest.importorskip("torch")
    request = GenerationRequest(
        [[1, 2]],
        8,
        sampling=SamplingParams(0.8, 0, 0.9, 1.0, 5, presence_penalty=0.5, frequency_penalty=0.25),
        num_return_sequences=3,
        stop_words=((11,), (12,)),
        bad_words=((13,),),
        min_tokens=4,
        embedding_bias=np.arange(VOCAB, dtype=np.float32),
        return_log_probs=True,
        return_context_logits=True,
        return_generation_logits=True,
    )
    arguments = sampling_arguments(request, frozenset({END, 9}), PAD)
    bias = arguments.pop("embedding_bias")
    assert isinstance(bias, torch.Tensor) and bias.tolist() == list(range(VOCAB))
    assert arguments == {
        "max_tokens": 8, "pad_id": PAD, "detokenize": False, "seed": 5, "repetition_penalty": 1.0,
        "temperature": 0.8, "top_p": 0.9, "presence_penalty": 0.5, "frequency_penalty": 0.25, "end_id": END,
        "stop_token_ids": [9, 11, 12], "include_stop_str_in_output": True, "bad_token_ids": [13], "min_tokens": 4,
        "n": 3, "logprobs": 1, "return_context_logits": True, "return_generation_logits": True,
    }  # fmt: skip


SAMPLED = SamplingParams(temperature=1.0, top_k=4)
ASKED = {"return_log_probs": True, "return_generation_logits": True, "return_context_logits": True}


def test_several_sequences_come_back_with_their_index_log_probs_and_logits():
    sink = run_on_llm_api(
        FakeLlm([4, 5], [6]), GenerationRequest([[1, 2]], 4, sampling=SAMPLED, num_return_sequences=2, **ASKED)
    )
    assert sink.error is None
    assert [(list(o), o.index, o.log_probs, o.cum_log_prob) for o in sink.outputs] == [
        ([4, 5], 0, [-0.4, -0.5], pytest.approx(-0.9)),
        ([6], 1, [-0.6], pytest.approx(-0.6)),
    ]  # without the end token
    assert sink.outputs[0].generation_logits[:, 0].tolist() == [0, 1]  # the rows of its ids, not the end token's
    assert sink.outputs[1].generation_logits.shape == (1, VOCAB) and sink.outputs[1].generation_logits[0, 0] == 100
    assert sink.outputs[0].context_logits.shape == (2, VOCAB)


def test_streamed_pieces_carry_their_sequence_and_only_their_own_log_probs_and_logits():
    request = GenerationRequest([[1]], 4, sampling=SAMPLED, num_return_sequences=2, streaming=True, **ASKED)
    sink = run_on_llm_api(FakeLlm([4, 5], [6]), request)
    assert [(piece.index, list(piece), piece.log_probs) for piece in sink.streamed] == [
        (0, [4], [-0.4]), (1, [6], [-0.6]), (0, [5], [-0.5]),
    ]  # fmt: skip
    assert [piece.cum_log_prob for piece in sink.streamed] == pytest.approx([-0.4, -0.6, -0.9])  # the sum so far
    # streaming, TensorRT-LLM keeps only the latest step's logits: each piece has the rows of its own ids
    assert [piece.generation_logits[:, 0].tolist() for piece in sink.streamed] == [[0], [100], [1]]
    assert [piece.context_logits is not None for piece in sink.streamed] == [True, True, False]
    assert sink.outputs is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"stop_words": ((3, 4),)}, "stop_words: the trtllm_pytorch engine takes single-token words only"),
        ({"bad_words": ((3,), (4, 5))}, "bad_words: the trtllm_pytorch engine takes single-token words only"),
        ({"num_return_sequences": 2}, "num_return_sequences 2 with greedy decoding: the trtllm_pytorch engine"),
        ({"beam_width": 4}, "beam_width 4: the trtllm_pytorch engine decodes one beam"),
        ({"return_perf_metrics": True}, "return_perf_metrics true: the trtllm_pytorch engine keeps no"),
    ],
)
def test_what_the_llm_api_cannot_take_is_refused_by_name(changes, message):
    llm = FakeLlm([4])
    sink = run_on_llm_api(llm, GenerationRequest([[1]], 4, **changes))
    assert sink.error.startswith(message) and llm.calls == []


def test_a_missing_result_field_is_an_error_not_a_silent_gap():
    llm = FakeLlm([4], missing="generation_logits")
    sink = run_on_llm_api(llm, GenerationRequest([[1]], 4, return_generation_logits=True))
    assert sink.error == "TensorRT-LLM: TensorRT-LLM returned no generation logits"
    short = FakeLlm([4, 5], missing="logprobs")
    sink = run_on_llm_api(short, GenerationRequest([[1]], 4, sampling=SAMPLED, return_log_probs=True))
    assert sink.error == "TensorRT-LLM: TensorRT-LLM returned no log probabilities for every token"
