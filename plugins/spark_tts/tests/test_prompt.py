"""Spark-TTS prompt ids and semantic-token parsing, against the tokenizer spelling the official prompt out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trtdeploy_spark_tts.prompt import (
    SEMANTIC_CODES,
    PromptCodec,
    added_tokens,
    global_token,
    semantic_token,
    semantic_tokens_for,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtdeploy.checkpoints import write_bpe_tokenizer

    folder = tmp_path_factory.mktemp("spark-tokenizer")
    write_bpe_tokenizer(folder, added_tokens=added_tokens())
    return folder


@pytest.fixture(scope="module")
def codec(folder: Path) -> PromptCodec:
    return PromptCodec.load(folder)


@pytest.fixture(scope="module")
def hf_tokenizer(folder: Path):
    """The checkpoint's tokenizer as transformers loads it: the reference for the ids."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def official_prompt(reference_text: str | None, target: str, globals_: list[int], semantic: list[int]) -> str:
    """The prompt as the official code writes it: every token spelled out in one string."""
    head = f"<|task_tts|><|start_content|>{reference_text or ''}{target}<|end_content|><|start_global_token|>"
    head += "".join(global_token(code) for code in globals_) + "<|end_global_token|>"
    if reference_text is None:
        return head
    return head + "<|start_semantic_token|>" + "".join(semantic_token(code) for code in semantic)


@pytest.mark.parametrize("reference_text", ["The quick brown fox.", "今天天气很好", None])
def test_prompt_ids_equal_tokenizing_the_official_prompt(codec, hf_tokenizer, reference_text: str | None) -> None:
    rng = np.random.default_rng(1)
    globals_ = rng.integers(0, 4096, 32).tolist()
    semantic = rng.integers(0, SEMANTIC_CODES, 120).tolist()
    target = "Speech synthesis turns text into audio!"
    text_ids = codec.text_ids(reference_text or "", target)
    ids = codec.prompt_ids(text_ids, np.array(globals_), None if reference_text is None else np.array(semantic))
    expected = hf_tokenizer.encode(
        official_prompt(reference_text, target, globals_, semantic), add_special_tokens=False
    )
    assert ids.tolist() == expected
    assert ids.size == codec.prompt_length(text_ids, None if reference_text is None else len(semantic))


def test_special_ids_are_the_tokenizers(codec: PromptCodec, hf_tokenizer) -> None:
    assert (codec.eos_id, codec.pad_id) == (hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id)


def test_semantic_codes_are_read_back_in_order_and_other_tokens_dropped(codec: PromptCodec) -> None:
    codes = [0, 17, 8191, 4000]
    ids = [codec.semantic_ids[codes[0]], codec.eos_id, codec.semantic_ids[codes[1]], codec.global_ids[3]]
    ids += [codec.semantic_ids[codes[2]], 5, codec.semantic_ids[codes[3]], 10**9, -1]
    assert codec.semantic_codes(np.array(ids)).tolist() == codes


def test_a_tokenizer_without_spark_tokens_is_refused(tmp_path: Path) -> None:
    from trtdeploy.checkpoints import write_bpe_tokenizer

    write_bpe_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="lacks Spark-TTS's special tokens"):
        PromptCodec.load(tmp_path)


def test_semantic_token_estimate_rounds_up() -> None:
    assert semantic_tokens_for(16000) == 50
    assert semantic_tokens_for(16001) == 51
