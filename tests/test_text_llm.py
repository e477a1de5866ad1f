"""The text-LLM pipeline for any model family: streaming detokenization that gives the whole text whatever the
tokenizer, and families configured in a few lines (a Llama with a sentencepiece tokenizer, a Llama 3 with several
end tokens) served end to end by the real tritonserver, their text equal to transformers' greedy output."""

from __future__ import annotations

import queue
import random

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from trtdeploy import TextLLMSpec, hookimpl
from trtdeploy.checkpoints import TOKENIZER_KINDS, write_tokenizer
from trtdeploy.plugins import forget_registrations, pm
from trtdeploy.text_llm.detokenize import TokenizerText

TEXTS = ("The quick brown fox jumps over the lazy dog.", "Zebra 😀 über 今天天气很好 ok", "two  spaces\nnew line")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("tokenizers")
    for kind in TOKENIZER_KINDS:
        write_tokenizer(root / kind, kind)
    return {kind: AutoTokenizer.from_pretrained(str(root / kind)) for kind in TOKENIZER_KINDS}


def decoder(tokenizer):
    """How postprocessing decodes a whole sequence: special tokens skipped, no clean-up of spaces."""
    return TokenizerText(tokenizer, skip_special_tokens=True).decode


def streamed(tokenizer, ids, sizes):
    """The texts of ``ids`` sent in pieces of ``sizes`` tokens, the stream's end flushed last."""
    detokenizer = TokenizerText(tokenizer, skip_special_tokens=True).stream()
    pieces, start = [], 0
    for size in sizes:
        pieces.append(detokenizer.add(ids[start : start + size]))
        start += size
    return [*pieces, detokenizer.flush()]


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_streamed_pieces_join_into_the_whole_text(tokenizers, kind):
    tokenizer = tokenizers[kind]
    decode, rng = decoder(tokenizer), random.Random(0)
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for sizes in ([1] * len(ids), [rng.randint(1, 3) for _ in ids]):
            assert "".join(streamed(tokenizer, ids, sizes)) == decode(ids), (text, sizes)
    for _ in range(200):  # what a random model says: any tokens, special and byte pieces among them
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 24))]
        assert "".join(streamed(tokenizer, ids, [1] * len(ids))) == decode(ids), ids
    for _ in range(20):  # long enough for the context to be cut back many times, in pieces of any size
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(50, 200))]
        sizes = [rng.randint(1, 5) for _ in ids]
        assert "".join(streamed(tokenizer, ids, sizes)) == decode(ids), ids


def test_a_piece_keeps_the_leading_space_that_decoding_it_alone_drops(tokenizers):
    tokenizer = tokenizers["llama"]
    decode = decoder(tokenizer)
    ids = tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"]
    assert "".join(decode([token]) for token in ids) != "The quick brown fox"  # each piece alone loses its space
    pieces = streamed(tokenizer, ids, [1] * len(ids))
    assert "".join(pieces) == "The quick brown fox" and any(piece.startswith(" ") for piece in pieces)


@pytest.mark.parametrize("kind", ["llama", "llama3"])  # byte fallback pieces, byte-level tokens
def test_a_character_spelled_in_bytes_comes_whole(tokenizers, kind):
    tokenizer = tokenizers[kind]
    decode = decoder(tokenizer)
    ids = tokenizer("😀 ok 😀", add_special_tokens=False)["input_ids"]
    assert len(ids) > 6  # each 😀 is four bytes
    pieces = streamed(tokenizer, ids, [1] * len(ids))
    assert "".join(pieces) == "😀 ok 😀" and "\ufffd" not in "".join(pieces)
    assert sum("😀" in piece for piece in pieces) == 2  # each in one piece
    cut = ids[: ids.index(ids[-1]) if kind == "llama" else -1]  # the stream ends inside the second 😀
    pieces = streamed(tokenizer, cut, [1] * len(cut))
    assert "".join(pieces) == decode(cut) and pieces[-1].endswith("\ufffd")  # flushed as the whole text has it


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
@pytest.mark.parametrize("loop", ["invalid byte", "special token", "id past the vocabulary"])
def test_a_model_looping_on_a_token_without_text_costs_a_few_tokens_decoded_per_piece(
    tokenizers, kind, loop, monkeypatch
):
    """A random model can loop on a token that adds no text of its own: a lone UTF-8 continuation byte (the text then
    ends in U+FFFD after every token, or a run of byte pieces goes on), a special token that decoding skips, or an id
    of the embedding's padded rows, past the tokenizer's vocabulary. The stream still costs a few tokens decoded per
    piece, not the stream so far, and every invalid byte of a byte-level tokenizer is sent one token behind its own."""
    tokenizer = tokenizers[kind]
    text = TokenizerText(tokenizer, skip_special_tokens=True)
    if loop == "special token":
        looped = tokenizer.all_special_ids[0]
    elif loop == "id past the vocabulary":
        looped = len(tokenizer) + 10
    elif kind == "llama":  # sentencepiece: a byte piece, the run held until a piece that is not a byte ends it
        looped = tokenizer.convert_tokens_to_ids("<0x80>")
    else:
        looped = next(index for index in range(len(tokenizer)) if text.decode([index] * 2) == "\ufffd" * 2)
    ids = tokenizer("ok 😀", add_special_tokens=False)["input_ids"] + [looped] * 500
    ids += tokenizer(" end", add_special_tokens=False)["input_ids"]
    whole = text.decode(ids)
    decoded, decode = [], tokenizer.decode

    def counting_decode(window, **options):
        decoded.append(len(window))
        return decode(window, **options)

    monkeypatch.setattr(tokenizer, "decode", counting_decode)
    detokenizer = text.stream()
    pieces = [detokenizer.add([token]) for token in ids] + [detokenizer.flush()]
    assert "".join(pieces) == whole
    assert sum(decoded) <= 20 * len(ids)  # the stream so far at every piece would be over 100,000
    if loop == "invalid byte" and kind != "llama":
        assert sum(piece == "\ufffd" for piece in pieces) >= 490


def test_a_unigram_tokenizer_with_byte_fallback_streams_a_character_spelled_in_bytes_whole():
    """A Unigram model has no byte-fallback setting of its own (its decoder falls back): its byte pieces are held as
    runs all the same, since a run's invalid bytes decode to one U+FFFD each, which a later byte rewrites."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = [("<unk>", 0.0), ("\u2581a", -1.0)] + [(f"<0x{byte:02X}>", -5.0) for byte in range(256)]
    unigram = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=unigram, unk_token="<unk>")
    ids = [1, *(tokenizer.convert_tokens_to_ids(f"<0x{byte:02X}>") for byte in "中".encode()), 1]
    pieces = streamed(tokenizer, ids, [1] * len(ids))
    assert "".join(pieces) == decoder(tokenizer)(ids) == " a中 a" and "\ufffd" not in "".join(pieces)
    assert pieces[:-1] == [" a", "", "", "", "中 a"]  # the run held until a piece that is not a byte ends it


# --- model families configured in a few lines, end to end --------------------------------------------------------


class TinyLlama(TextLLMSpec):
    name = "test_tiny_llama"
    default_repo = "test/tiny-llama"
    architectures = ("LlamaForCausalLM",)
    tokenizer_kind = "llama"


class TinyLlama3(TextLLMSpec):
    name = "test_tiny_llama3"
    default_repo = "test/tiny-llama3"
    architectures = ("LlamaForCausalLM",)
    tokenizer_kind = "llama3"
    end_tokens = ("<|reserved_special_token_4|>",)


class _Families:
    @hookimpl
    def register_models(self, register):
        register(TinyLlama())
        register(TinyLlama3())


@pytest.fixture(scope="module", autouse=True)
def families():
    pm.register(_Families(), name="test-text-llm-families")
    forget_registrations()
    yield
    pm.unregister(name="test-text-llm-families")
    forget_registrations()


def test_a_served_ensemble_is_recognized_by_the_text_llm_it_names():
    from trtdeploy.perf.workload import ModelInfo, TensorSpec
    from trtdeploy.remote import recognized_by

    def ensemble(**parameters: str) -> ModelInfo:
        tensors = {name: TensorSpec(name, "BYTES", (1,)) for name in ("text_input", "max_tokens", "text_output")}
        inputs = {name: tensors[name] for name in ("text_input", "max_tokens")}
        return ModelInfo("ensemble", inputs, {"text_output": tensors["text_output"]}, 4, parameters=parameters)

    assert recognized_by(ensemble(text_llm="test_tiny_llama"), warn=pytest.fail) == ["test_tiny_llama"]
    # TensorRT-LLM's own ensemble names none: every text LLM speaks it (perf takes the first where they load it alike)
    assert set(recognized_by(ensemble(), warn=pytest.fail)) == {
        "qwen_llm",
        "llama_llm",
        "mistral_llm",
        "test_tiny_llama",
        "test_tiny_llama3",
    }


def _inputs(prompt: str, max_tokens: int, *, stream: bool | None, **extra: np.ndarray):
    arrays = {
        "text_input": np.array([[prompt.encode()]], dtype=object),
        "max_tokens": np.array([[max_tokens]], dtype=np.int32),
        **({} if stream is None else {"stream": np.array([[stream]])}),
        **extra,
    }
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def ask(server, prompt: str, max_tokens: int, *, stream: bool, **extra: np.ndarray) -> tuple[list[str], list[int]]:
    """The texts of the responses to one request, and the token ids they carry."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("text_output", "output_ids", "sequence_length")]
    if not stream:
        result = client.infer("ensemble", _inputs(prompt, max_tokens, stream=None, **extra), outputs=outputs)
        return [result.as_numpy("text_output")[0].decode()], result.as_numpy("output_ids")[0, 0].tolist()
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(
            "ensemble", _inputs(prompt, max_tokens, stream=True, **extra), outputs=outputs,
            enable_empty_final_response=True,
        )  # fmt: skip
        texts, ids = [], []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            if result.as_numpy("text_output") is not None:
                texts.append(result.as_numpy("text_output")[0].decode())
                ids += result.as_numpy("output_ids")[0, 0, : result.as_numpy("sequence_length")[0, 0]].tolist()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return texts, ids
    finally:
        client.stop_stream()


def bias(*words: str, weight: float = 100.0) -> dict[str, np.ndarray]:
    """Inputs that make the model say ``words`` (whatever its random weights prefer)."""
    return {
        "embedding_bias_words": np.array([[word.encode() for word in words]], dtype=object),
        "embedding_bias_weights": np.array([[weight] * len(words)], dtype=np.float32),
    }


def greedy(deployment, prompt: str, max_tokens: int) -> list[int]:
    """transformers' greedy answer to ``prompt`` (as the deployment's preprocessing encodes it), its end token cut."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(deployment.llm_dir))
    model = AutoModelForCausalLM.from_pretrained(str(deployment.llm_dir)).eval()
    prompt_ids = tokenizer(prompt)["input_ids"]
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    answer = out[0, len(prompt_ids) :].tolist()
    return answer[:-1] if answer and answer[-1] == tokenizer.eos_token_id else answer


PROMPT = "The quick brown fox"


@pytest.mark.server
def test_a_sentencepiece_llama_streams_the_text_it_answers_offline(trtdeploy_deploy, trtdeploy_serve):
    limits = {"max_input_len": 64, "max_output_len": 32}
    streaming = trtdeploy_deploy("test_tiny_llama", mode="streaming", **limits)
    offline = trtdeploy_deploy("test_tiny_llama", mode="offline", **limits)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(streaming.llm_dir))
    assert type(tokenizer).__name__ == "LlamaTokenizer" and tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id
    config = grpcclient.InferenceServerClient(trtdeploy_serve(streaming).grpc_url).get_model_config("ensemble")
    assert config.config.parameters["text_llm"].string_value == "test_tiny_llama"  # what perf --url tells it by
    texts, ids = ask(trtdeploy_serve(streaming), PROMPT, 24, stream=True)
    whole, offline_ids = ask(trtdeploy_serve(offline), PROMPT, 24, stream=False)
    assert len(texts) > 1 and ids == offline_ids == greedy(streaming, PROMPT, 24)  # the torch engine is exact
    assert "".join(texts) == whole[0] == decoder(tokenizer)(ids)
    # words with their leading space ("▁the"): every piece but the first starts with its space
    texts, ids = ask(trtdeploy_serve(streaming), PROMPT, 6, stream=True, **bias("the"))
    assert tokenizer.convert_ids_to_tokens(ids) == ["▁the"] * 6
    assert "".join(texts) == "the the the the the the" and len(texts) > 1
    assert texts[0].startswith("the") and all(text.startswith(" the") for text in texts[1:])
    assert ask(trtdeploy_serve(offline), PROMPT, 6, stream=False, **bias("the"))[0] == ["the the the the the the"]


@pytest.mark.server
def test_a_llama3_answer_ends_at_any_of_its_end_tokens(trtdeploy_deploy, trtdeploy_serve):
    deployment = trtdeploy_deploy("test_tiny_llama3", mode="streaming", max_input_len=64, max_output_len=32)
    server = trtdeploy_serve(deployment)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(deployment.llm_dir))
    texts, ids = ask(server, PROMPT, 16, stream=True)
    assert ids == greedy(deployment, PROMPT, 16) and "".join(texts) == decoder(tokenizer)(ids)
    end_of_text, reserved, eot = tokenizer.convert_tokens_to_ids(
        ["<|end_of_text|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
    )
    # generation_config.json's other end token, and the spec's end_tokens: kept in the output, as stop words are
    assert ask(server, PROMPT, 8, stream=True, **bias("<|end_of_text|>")) == ([""], [end_of_text])
    assert ask(server, PROMPT, 8, stream=True, **bias("<|reserved_special_token_4|>")) == ([""], [reserved])
    assert ask(server, PROMPT, 8, stream=True, **bias("<|eot_id|>")) == ([], [])  # the EOS itself: end_id
    never = {"end_id": np.array([[-1]], dtype=np.int32)}  # a request that names its end has that end alone
    assert ask(server, PROMPT, 8, stream=True, **never, **bias("<|end_of_text|>"))[1] == [end_of_text] * 8
    assert eot == tokenizer.eos_token_id
