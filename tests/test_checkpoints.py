"""Random checkpoints in the real layout of each tokenizer kind: transformers loads them as it loads the published
ones, and their tokenizers behave as the real kinds do (BOS, end tokens, metaspace, byte fallback, templates)."""

from __future__ import annotations

import json

import pytest

from trtdeploy.checkpoints import TOKENIZER_KINDS, write_random_causal_lm, write_tokenizer

TEXTS = ("The quick brown fox", " leading space", "Zebra 😀 über 今天", "two  spaces\nand a line")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Each kind's tokenizer folder, instruct and base."""
    root = tmp_path_factory.mktemp("tokenizers")
    folders = {}
    for kind in TOKENIZER_KINDS:
        for chat in (True, False):
            folders[kind, chat] = root / f"{kind}-{'chat' if chat else 'base'}"
            write_tokenizer(folders[kind, chat], kind, chat_template=chat)
    return folders


def load(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_transformers_encodes_as_the_tokenizer_json_says_and_decodes_back(tokenizers, kind):
    from tokenizers import Tokenizer

    folder = tokenizers[kind, True]
    tokenizer, raw = load(folder), Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids == raw.encode(text).ids, text
        expected = text.lstrip(" ") if kind == "llama" and text.startswith(" ") else text  # sentencepiece's strip
        assert tokenizer.decode(ids, skip_special_tokens=True) == expected


def test_the_llama_kind_is_a_sentencepiece_tokenizer(tokenizers):
    tokenizer = load(tokenizers["llama", True])
    assert type(tokenizer).__name__ == "LlamaTokenizer"
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.pad_token is None
    assert tokenizer.convert_ids_to_tokens([3, 258]) == ["<0x00>", "<0xFF>"]
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("The quick 😀")["input_ids"])
    assert tokens[0] == "<s>" and tokens[1].startswith("▁") and "▁qu" in "".join(tokens)  # words carry their space
    assert tokens[-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]  # an unknown character: its UTF-8 bytes
    # a word decoded at the start of a text loses its space, after another word keeps it
    word = tokenizer(" quick", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(word) == "quick"
    assert tokenizer.decode(tokenizer("The", add_special_tokens=False)["input_ids"] + word) == "The quick"
    config = json.loads((tokenizers["llama", True] / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is True and config["legacy"] is False
    assert json.loads((tokenizers["llama", True] / "special_tokens_map.json").read_text())["eos_token"] == "</s>"
    chat = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], tokenize=False
    )
    assert chat == "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"
    assert load(tokenizers["llama", False]).chat_template is None  # a base model's


def test_the_llama3_kind_has_its_special_tokens_after_the_vocabulary(tokenizers):
    tokenizer = load(tokenizers["llama3", True])
    specials = tokenizer.convert_tokens_to_ids(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
    assert specials == [len(tokenizer) - 10, len(tokenizer) - 9, len(tokenizer) - 1]
    assert tokenizer("Hi")["input_ids"][0] == tokenizer.bos_token_id == specials[0]
    assert tokenizer.eos_token == "<|eot_id|>" and load(tokenizers["llama3", False]).eos_token == "<|end_of_text|>"
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    words = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str("it's 12345")
    assert [word for word, _ in words] == ["it", "'s", "Ġ", "123", "45"]  # tiktoken's split


def test_the_qwen2_kind_has_no_bos_and_chatml(tokenizers):
    tokenizer = load(tokenizers["qwen2", True])
    assert tokenizer.bos_token is None and tokenizer.eos_token == "<|im_end|>"
    assert (tokenizers["qwen2", True] / "vocab.json").is_file() and (tokenizers["qwen2", True] / "merges.txt").is_file()
    assert load(tokenizers["qwen2", False]).chat_template is None


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("qwen2", {"rope_theta": 1e6, "tie_word_embeddings": True, "max_position_embeddings": 4096}),
        ("llama", {"rope_theta": 1e4, "tie_word_embeddings": False, "max_position_embeddings": 4096}),
        ("llama3", {"rope_theta": 5e5, "tie_word_embeddings": False, "max_position_embeddings": 8192}),
    ],
)
def test_a_llama_checkpoint_of_each_kind_loads_with_its_family_config(tmp_path, kind, expected):
    import transformers

    write_random_causal_lm(tmp_path, architecture="LlamaForCausalLM", tokenizer=kind)
    config = transformers.AutoConfig.from_pretrained(str(tmp_path))
    tokenizer = load(tmp_path)
    assert config.architectures == ["LlamaForCausalLM"]
    assert config.rope_parameters["rope_theta"] == expected.pop("rope_theta")
    assert {key: getattr(config, key) for key in expected} == expected
    assert (config.bos_token_id, config.eos_token_id) == (tokenizer.bos_token_id, tokenizer.eos_token_id)
    assert config.vocab_size >= len(tokenizer)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert type(model).__name__ == "LlamaForCausalLM"
    ends = json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"]
    if kind == "llama3":  # an Instruct model ends its answers at <|eot_id|> and at <|end_of_text|>
        assert ends == tokenizer.convert_tokens_to_ids(["<|end_of_text|>", "<|eot_id|>"])
    else:
        assert ends == tokenizer.eos_token_id


def test_config_overrides_win(tmp_path):
    import transformers

    overrides = {"rope_theta": 1234.0, "tie_word_embeddings": True, "num_key_value_heads": 4}
    write_random_causal_lm(
        tmp_path, architecture="LlamaForCausalLM", tokenizer="llama", max_position_embeddings=512, config=overrides
    )
    config = transformers.AutoConfig.from_pretrained(str(tmp_path))
    assert config.rope_parameters["rope_theta"] == 1234.0
    assert (config.tie_word_embeddings, config.num_key_value_heads, config.max_position_embeddings) == (True, 4, 512)
