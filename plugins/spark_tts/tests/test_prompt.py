"""Spark-TTS prompt ids and semantic-token parsing, against the tokenizer spelling the official prompt out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trtdeploy_spark_tts.prompt import (
    SEMANTIC_CODES,
    PromptCodec,
    added_tokens,
    end_token,
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
def bos_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer whose post-processor puts a BOS before every sequence (as Llama's does)."""
    from tokenizers import Tokenizer, processors

    from trtdeploy.checkpoints import write_bpe_tokenizer

    folder = tmp_path_factory.mktemp("spark-bos-tokenizer")
    write_bpe_tokenizer(folder, added_tokens=added_tokens())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos = "<|im_start|>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module", params=["qwen2", "with-bos"])
def folder_and_codec(request, folder: Path, bos_folder: Path) -> tuple[Path, PromptCodec]:
    chosen = folder if request.param == "qwen2" else bos_folder
    return chosen, PromptCodec.load(chosen)


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
def test_prompt_ids_equal_tokenizing_the_official_prompt(folder_and_codec, reference_text: str | None) -> None:
    """The official BLS tokenizes the prompt string with the tokenizer's default special-token handling."""
    from transformers import AutoTokenizer

    tokenizer_dir, codec = folder_and_codec
    hf_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    rng = np.random.default_rng(1)
    globals_ = rng.integers(0, 4096, 32).tolist()
    semantic = rng.integers(0, SEMANTIC_CODES, 120).tolist()
    target = "Speech synthesis turns text into audio!"
    text_ids = codec.text_ids(reference_text or "", target)
    ids = codec.prompt_ids(text_ids, np.array(globals_), None if reference_text is None else np.array(semantic))
    expected = hf_tokenizer([official_prompt(reference_text, target, globals_, semantic)]).input_ids[0]
    assert ids.tolist() == expected
    assert ids.size == codec.prompt_length(text_ids, None if reference_text is None else len(semantic))


def test_the_bos_tokenizer_really_adds_one(bos_folder: Path) -> None:
    codec = PromptCodec.load(bos_folder)
    assert codec.text_ids("", "hi")[0] == codec.prefix_ids[0] and len(codec.prefix_ids) == 1


def test_special_ids_are_the_tokenizers(codec: PromptCodec, hf_tokenizer) -> None:
    assert (codec.eos_id, codec.pad_id) == (hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id)


def write_config(folder: Path, name: str, eos_token_id) -> None:
    import json

    (folder / name).write_text(json.dumps({"eos_token_id": eos_token_id}))


def test_the_end_token_is_the_models_own_when_the_tokenizer_disagrees(folder: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    tokenizer_eos = PromptCodec.load(tmp_path).eos_id
    assert end_token(tmp_path, tokenizer_vocab(tmp_path)) == (tokenizer_eos, None)  # no config: the tokenizer's
    write_config(tmp_path, "config.json", tokenizer_eos)
    assert end_token(tmp_path, tokenizer_vocab(tmp_path)) == (tokenizer_eos, None)  # the released checkpoint's case
    write_config(tmp_path, "config.json", 7)
    eos, note = end_token(tmp_path, tokenizer_vocab(tmp_path))
    assert eos == 7 == PromptCodec.load(tmp_path).eos_id
    assert "ends on id 7 (config.json eos_token_id, which the official CLI stops on)" in note
    assert f"eos_token '<|im_end|>' (id {tokenizer_eos}, which the official Triton BLS sends)" in note
    write_config(tmp_path, "generation_config.json", [9, tokenizer_eos])  # generate() reads this one first
    assert end_token(tmp_path, tokenizer_vocab(tmp_path)) == (tokenizer_eos, None)


def tokenizer_vocab(folder: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True)


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
