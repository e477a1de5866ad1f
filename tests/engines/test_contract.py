"""The LLM contract's tensors: parsing a request's inputs, and laying results out as TRT-LLM's backend sends them."""

from __future__ import annotations

import numpy as np
import pytest

from trtdeploy.engines.contract import (
    GenerationRequest,
    SamplingParams,
    SequenceOutput,
    parse_request,
    response_arrays,
    word_list,
)


def tensors(rows: list[list[int]], **extra) -> dict[str, np.ndarray]:
    longest = max(len(row) for row in rows)
    ids = np.zeros((len(rows), longest), dtype=np.int32)
    for position, row in enumerate(rows):
        ids[position, : len(row)] = row
    found = {
        "input_ids": ids,
        "input_lengths": np.array([[len(row)] for row in rows], dtype=np.int32),
        "request_output_len": np.full((len(rows), 1), 8, dtype=np.int32),
    }
    return found | {name: np.asarray(value) for name, value in extra.items()}


def parse(inputs, decoupled=True):
    return parse_request(inputs, decoupled=decoupled, exclude_input=True)


def test_word_lists_read_trtllms_layout():
    # "3 4" and "5", then padding: ids padded with 0, end offsets with -1 (what tensorrtllm_backend's preprocessing
    # writes); an empty word is dropped
    assert word_list(np.array([[3, 4, 5, 0], [2, 3, 3, -1]])) == ((3, 4), (5,))
    assert word_list(np.zeros((2, 0), dtype=np.int32)) == ()
    with pytest.raises(ValueError, match="malformed word list: offset 5 after 0 in 2 token ids"):
        word_list(np.array([[3, 4], [5, -1]]))


def test_every_input_of_the_contract_is_read():
    words = np.array([[[3, 4, 5], [2, 3, -1]]], dtype=np.int32)
    request = parse(
        tensors(
            [[9, 8, 7]],
            end_id=[[2]], pad_id=[[0]], streaming=[[False]], exclude_input_in_output=[[False]], temperature=[[0.5]],
            runtime_top_k=[[4]], runtime_top_p=[[0.8]], random_seed=np.array([[11]], np.uint64),
            repetition_penalty=[[1.2]], presence_penalty=[[0.3]], frequency_penalty=[[0.4]], min_length=[[3]],
            beam_width=[[1]], len_penalty=[[1.0]], num_return_sequences=[[2]], return_log_probs=[[True]],
            return_context_logits=[[True]], return_generation_logits=[[True]], return_perf_metrics=[[False]],
            return_num_input_tokens=[[True]], return_num_output_tokens=[[True]], stop_words_list=words,
            bad_words_list=np.array([[[6], [1]]], np.int32), embedding_bias=np.array([[0.0, 1.5]], np.float32),
        )
    )  # fmt: skip
    assert request.input_ids == [[9, 8, 7]] and request.max_new_tokens == 8 and request.end_id == 2
    assert request.sampling == SamplingParams(0.5, 4, 0.8, 1.2, 11, presence_penalty=0.3, frequency_penalty=0.4)
    assert not request.streaming and not request.exclude_input
    assert (request.min_tokens, request.beam_width, request.length_penalty) == (3, 1, 1.0)
    assert request.num_return_sequences == 2
    assert request.stop_words == ((3, 4), (5,)) and request.bad_words == ((6,),)
    assert request.embedding_bias.tolist() == [0.0, 1.5]
    assert request.return_log_probs and request.return_context_logits and request.return_generation_logits
    assert request.return_num_input_tokens and request.return_num_output_tokens and not request.return_perf_metrics


def test_defaults():
    request = parse(tensors([[1]], beam_width=[[0]]))
    assert (request.sampling, request.min_tokens, request.beam_width) == (SamplingParams(), 0, 1)
    assert request.streaming and request.num_return_sequences == 1 and request.stop_words == ()
    assert request.embedding_bias is None and request.length_penalty is None
    empty = tensors([[1]], stop_words_list=np.zeros((1, 2, 0), np.int32), embedding_bias=np.zeros((1, 0), np.float32))
    assert parse(empty).stop_words == () and parse(empty).embedding_bias is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"temperature": [[0.5], [1.0]]}, "temperature differs between the 2 rows of one request"),
        (
            {"stop_words_list": np.array([[[3], [1]], [[4], [1]]], np.int32)},
            "stop_words_list differs between the 2 rows",
        ),
        ({"num_return_sequences": [[-1], [-1]]}, "num_return_sequences must be at least 1"),
    ],
)
def test_rows_of_one_request_share_their_settings(extra, message):
    with pytest.raises(ValueError, match=message):
        parse(tensors([[1], [2]], **extra))
    assert parse(tensors([[1], [2]], temperature=[[0.5], [0.5]])).sampling.temperature == 0.5


def test_a_vocabulary_wide_bias_is_shared_by_rows_that_repeat_it_masks_and_all():
    bias = np.full(158336, -np.inf, dtype=np.float32)
    bias[100:6661] = np.linspace(-1, 1, 6561)
    bias[7] = np.nan
    request = parse(tensors([[1], [2]], embedding_bias=np.stack([bias, bias])))
    assert np.array_equal(request.embedding_bias, bias, equal_nan=True)
    other = bias.copy()
    other[200] = 0.5
    with pytest.raises(ValueError, match="embedding_bias differs between the 2 rows"):
        parse(tensors([[1], [2]], embedding_bias=np.stack([bias, other])))


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        ([[1]], {"streaming": [[True]]}, "streaming=true needs a decoupled model"),
        ([[1], [2]], {}, "input_ids with 2 prompts needs a decoupled model"),
        ([[1]], {"num_return_sequences": [[3]]}, "num_return_sequences 3 needs a decoupled model"),
    ],
)
def test_a_model_that_is_not_decoupled_answers_one_sequence_per_request(rows, extra, message):
    """As TensorRT-LLM's backend: it refuses a batch there, and would send one response per sequence."""
    with pytest.raises(ValueError, match=f"^{message} \\(deploy with --mode streaming\\); this deployment is offline"):
        parse(tensors(rows, **extra), decoupled=False)
    assert parse(tensors(rows, **extra), decoupled=True).input_ids == rows
    one = parse(tensors([[1]], streaming=[[False]], num_return_sequences=[[1]], pad_id=[[5]]), decoupled=False)
    assert not one.streaming and one.num_return_sequences == 1


def sequence(tokens, row=0, index=0, **extra):
    return SequenceOutput(tokens, row=row, index=index, **extra)


def test_a_response_holds_one_sequence_and_what_the_request_asks_for():
    request = GenerationRequest([[1, 2]], 4, exclude_input=False, return_log_probs=True)
    output = sequence([1, 2, 5, 6], log_probs=[-1.0, -2.0], cum_log_prob=-3.0, prompt_tokens=2)
    arrays = response_arrays(request, output)
    assert arrays["output_ids"].tolist() == [[[1, 2, 5, 6]]] and arrays["sequence_length"].tolist() == [[4]]
    assert arrays["cum_log_probs"].tolist() == [[-3.0]] and arrays["output_log_probs"].tolist() == [[[-1.0, -2.0]]]
    assert set(arrays) == {"output_ids", "sequence_length", "cum_log_probs", "output_log_probs"}
    request.return_num_input_tokens = request.return_num_output_tokens = True
    arrays = response_arrays(request, output)
    assert arrays["num_input_tokens"].tolist() == [[2]] and arrays["num_output_tokens"].tolist() == [[2]]


def test_a_sequence_alone_is_tagged_with_its_row_and_index():
    request = GenerationRequest([[1, 2], [3]], 4, num_return_sequences=2, exclude_input=False)
    arrays = response_arrays(request, sequence([3, 8], 1, 1, prompt_tokens=1))
    assert arrays["output_ids"].tolist() == [[[3, 8]]]
    assert arrays["batch_index"].tolist() == [[1]] and arrays["sequence_index"].tolist() == [[1]]
    single = response_arrays(GenerationRequest([[1]], 4), sequence([4]))
    assert set(single) == {"output_ids", "sequence_length"}  # one row, one sequence: no index to tell


def test_logits_come_when_asked_and_context_logits_once():
    request = GenerationRequest([[1, 2]], 4, return_context_logits=True, return_generation_logits=True)
    first = sequence([5], generation_logits=np.ones((1, 3)), context_logits=np.zeros((2, 3)))
    arrays = response_arrays(request, first)
    assert arrays["context_logits"].shape == (1, 2, 3) and arrays["generation_logits"].shape == (1, 1, 1, 3)
    later = response_arrays(request, sequence([6], generation_logits=np.ones((1, 3))))
    assert "context_logits" not in later and later["generation_logits"].shape == (1, 1, 1, 3)
