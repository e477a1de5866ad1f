"""Random-weight checkpoints of real architectures, in the real Hugging Face on-disk layout.

Tests and offline trials need a model that loads and runs like the real one without the Hub: the weights are
noise, the layout, config and tokenizer behave like the published checkpoint's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: The tokenizers of random checkpoints, by the family whose published checkpoints have them on disk:
#:
#: - ``qwen2``: byte-level BPE (``vocab.json``, ``merges.txt``, ``tokenizer.json``), no BOS, ``<|im_end|>`` ends an
#:   answer, the ChatML template; Qwen2, Qwen2.5, Qwen3.
#: - ``llama``: the sentencepiece BPE of Llama 1/2, Mistral and TinyLlama as transformers converts it into
#:   ``tokenizer.json``: ``<unk>`` ``<s>`` ``</s>`` (ids 0, 1, 2), the 256 byte-fallback pieces ``<0x00>`` … ``<0xFF>``,
#:   the ``▁`` metaspace (words carry their leading space), BOS added to every prompt; the ``[INST]`` template.
#:   (The sentencepiece model file ``tokenizer.model`` beside it is not written: transformers reads tokenizer.json.)
#: - ``llama3``: Llama 3's byte-level BPE (tiktoken's split, ``ignore_merges``), special tokens after the vocabulary
#:   (``<|begin_of_text|>`` added to every prompt, ``<|eot_id|>`` ending an answer, ``<|end_of_text|>`` a text),
#:   tokenizer class ``PreTrainedTokenizerFast``; the header template.
TokenizerKind = Literal["qwen2", "llama", "llama3"]
TOKENIZER_KINDS: tuple[TokenizerKind, ...] = ("qwen2", "llama", "llama3")

#: Enough text in several scripts for a byte-level BPE to learn merges from.
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Triton serves models; TensorRT-LLM builds engines.",
    "Speech synthesis turns text into audio, and speech recognition turns audio back into text.",
    "今天天气很好，我们一起去公园散步吧。语音合成把文字变成声音。",
    "Numbers like 1, 2, 3, 42 and 2048 appear in prompts, as do questions? And answers!",
)

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Llama 2 chat's format: each user turn ``<s>[INST] ... [/INST]`` (a system prompt inside the first, between
#: ``<<SYS>>`` markers), each answer `` ... </s>``.
LLAMA_CHAT_TEMPLATE = (
    "{% set system = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
    "{% for message in messages if message['role'] != 'system' %}"
    "{% if message['role'] == 'user' %}"
    "{% set content = ('<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' if loop.first and system else '') "
    "+ message['content'] %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
#: Llama 3 Instruct's format: ``<|begin_of_text|>``, then per turn a role header and the content ending in
#: ``<|eot_id|>``.
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
#: Llama 3's pre-tokenizer split (tiktoken's cl100k pattern, as in its tokenizer.json).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: The first special tokens of Llama 3's vocabulary (ids 128000 … 128009 in the real one), in their order.
LLAMA3_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>",
    "<|reserved_special_token_3|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_4|>",
    "<|eot_id|>",
)
#: What transformers writes as ``model_max_length`` for a tokenizer without a length limit.
_UNLIMITED = 1000000000000000019884624838656


@dataclass(frozen=True)
class TinyShape:
    """Layer sizes of a random-weight model; tiny by default so CPU tests stay fast."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 512  # at least the tokenizer's size; rounded up like real checkpoints pad their vocab


#: Qwen2(.5)-0.5B, the LLM inside Spark-TTS and CosyVoice, for benchmarks at the real size.
QWEN2_0_5B = TinyShape(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
)


def write_bpe_tokenizer(
    dest: Path,
    *,
    special_tokens: Sequence[str] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    added_tokens: Sequence[str] = (),
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
    tokenizer_class: str = "Qwen2Tokenizer",
    vocab_size: int = 400,
    chat_template: str | None = QWEN_CHAT_TEMPLATE,
    pad_vocab_to: int | None = None,
) -> int:
    """Train a small byte-level BPE tokenizer and save it as a Qwen2-style tokenizer; returns its size.

    ``added_tokens`` are extra special tokens added after training (Spark-TTS's ``<|bicodec_semantic_0|>`` …).
    ``pad_vocab_to`` fills the vocabulary with tokens no text maps to (``<|filler_N|>``, without merges), up to that
    many before the added tokens: they get the ids they have in a real vocabulary of that size.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(_CORPUS) * 8, trainer)
    tokenizer = _padded(tokenizer, pad_vocab_to)
    _add_special_tokens(tokenizer, added_tokens)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(dest / "tokenizer.json"))
    tokenizer.model.save(str(dest))  # vocab.json + merges.txt, as published Qwen2 checkpoints have them
    config = {
        "tokenizer_class": tokenizer_class,
        "eos_token": eos_token,
        "pad_token": pad_token,
        "bos_token": None,
        "model_max_length": 32768,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer.get_vocab_size()


def write_llama_tokenizer(
    dest: Path,
    *,
    chat_template: bool = True,
    added_tokens: Sequence[str] = (),
    vocab_size: int = 400,
    pad_vocab_to: int | None = None,
) -> int:
    """Write a small tokenizer of Llama 2's kind (:data:`TokenizerKind` ``llama``) into ``dest``; returns its size.

    Its ``tokenizer.json`` is what transformers converts a Llama sentencepiece model into (no normalizer, a
    ``Metaspace`` pre-tokenizer that prepends ``▁`` to the text's first word only and does not split, a BPE model
    with byte fallback, the decoder that turns ``▁`` into spaces, fuses byte pieces and strips the text's leading
    space, BOS before every sequence); ``tokenizer_config.json`` and ``special_tokens_map.json`` are Llama-2's.
    ``vocab_size`` pieces are learned, the 256 byte pieces come on top. ``chat_template``: write Llama 2 chat's
    template (base models have none).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<unk>", "<s>", "</s>"]
    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    learner.train_from_iterator(list(_CORPUS) * 8, trainer)
    learned = json.loads(learner.to_str())["model"]
    pieces = [token for token, _ in sorted(learned["vocab"].items(), key=lambda item: item[1]) if token not in specials]
    bytes_ = [f"<0x{value:02X}>" for value in range(256)]
    vocab = {token: index for index, token in enumerate([*specials, *bytes_, *pieces])}
    merges = [tuple(merge) for merge in learned["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1)]
    )
    tokenizer = _padded(tokenizer, pad_vocab_to)
    _add_special_tokens(tokenizer, [*specials, *added_tokens])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", vocab["<s>"])]
    )
    names = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        **names,
        "pad_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": False,
        "model_max_length": _UNLIMITED,
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer",
    }
    _save(dest, tokenizer, config, LLAMA_CHAT_TEMPLATE if chat_template else None, names)
    return tokenizer.get_vocab_size()


def write_llama3_tokenizer(
    dest: Path,
    *,
    chat_template: bool = True,
    added_tokens: Sequence[str] = (),
    vocab_size: int = 400,
    pad_vocab_to: int | None = None,
) -> int:
    """Write a small tokenizer of Llama 3's kind (:data:`TokenizerKind` ``llama3``) into ``dest``; returns its size.

    Its ``tokenizer.json`` has Llama 3's pipeline (tiktoken's split then byte-level, BPE that takes whole words from
    the vocabulary before merging, ``<|begin_of_text|>`` before every sequence) and :data:`LLAMA3_SPECIAL_TOKENS`
    after the learned vocabulary (``pad_vocab_to=128000`` gives them their real ids). ``chat_template``: an Instruct
    model's tokenizer (the header template, ``<|eot_id|>`` as EOS); else a base model's (``<|end_of_text|>``).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(list(_CORPUS) * 8, trainer)
    tokenizer = _padded(tokenizer, pad_vocab_to)
    _add_special_tokens(tokenizer, [*LLAMA3_SPECIAL_TOKENS, *added_tokens])
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, tokenizer.token_to_id(bos))],
            ),
        ]
    )
    names = {"bos_token": bos, "eos_token": "<|eot_id|>" if chat_template else "<|end_of_text|>"}
    config = {
        **names,
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": _UNLIMITED,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    _save(dest, tokenizer, config, LLAMA3_CHAT_TEMPLATE if chat_template else None, names)
    return tokenizer.get_vocab_size()


def write_tokenizer(
    dest: Path,
    kind: TokenizerKind = "qwen2",
    *,
    chat_template: bool = True,
    added_tokens: Sequence[str] = (),
    pad_vocab_to: int | None = None,
) -> int:
    """Write a small tokenizer of ``kind`` (see :data:`TokenizerKind`) into ``dest``; returns its size."""
    if kind == "qwen2":
        template = QWEN_CHAT_TEMPLATE if chat_template else None
        return write_bpe_tokenizer(dest, added_tokens=added_tokens, chat_template=template, pad_vocab_to=pad_vocab_to)
    writers = {"llama": write_llama_tokenizer, "llama3": write_llama3_tokenizer}
    if kind not in writers:
        raise ValueError(f"unknown tokenizer kind {kind!r} (one of {', '.join(TOKENIZER_KINDS)})")
    return writers[kind](dest, chat_template=chat_template, added_tokens=added_tokens, pad_vocab_to=pad_vocab_to)


def _padded(tokenizer: Tokenizer, size: int | None) -> Tokenizer:
    """``tokenizer`` with its vocabulary filled up to ``size`` with tokens no text maps to (``<|filler_N|>``)."""
    from tokenizers import Tokenizer

    if size is None or size <= tokenizer.get_vocab_size():
        return tokenizer
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    vocab.update({f"<|filler_{index}|>": index for index in range(len(vocab), size)})
    return Tokenizer.from_str(json.dumps(data))


def _add_special_tokens(tokenizer: Tokenizer, tokens: Sequence[str]) -> None:
    from tokenizers import AddedToken

    if tokens:
        tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in tokens])


def _save(
    dest: Path, tokenizer: Tokenizer, config: dict[str, Any], chat_template: str | None, names: Mapping[str, str]
) -> None:
    """tokenizer.json, and tokenizer_config.json (``config``, its added tokens, the chat template) and
    special_tokens_map.json (``names``) as transformers writes them."""
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(dest / "tokenizer.json"))
    added = {
        str(index): {
            "content": token.content,
            "lstrip": token.lstrip,
            "normalized": token.normalized,
            "rstrip": token.rstrip,
            "single_word": token.single_word,
            "special": token.special,
        }
        for index, token in sorted(tokenizer.get_added_tokens_decoder().items())
    }
    config = {"added_tokens_decoder": added, **config}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (dest / "special_tokens_map.json").write_text(json.dumps(dict(names), indent=2) + "\n")


@dataclass(frozen=True)
class _Family:
    """config.json values of a tokenizer kind's model family, as its published checkpoints have them."""

    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    rms_norm_eps: float
    #: Tokens that end an answer (generation_config.json's ``eos_token_id``) besides the tokenizer's EOS.
    instruct_end_tokens: tuple[str, ...] = ()


_FAMILIES: dict[TokenizerKind, _Family] = {
    "qwen2": _Family(rope_theta=1e6, tie_word_embeddings=True, max_position_embeddings=4096, rms_norm_eps=1e-6),
    "llama": _Family(rope_theta=1e4, tie_word_embeddings=False, max_position_embeddings=4096, rms_norm_eps=1e-5),
    "llama3": _Family(
        rope_theta=5e5,
        tie_word_embeddings=False,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        instruct_end_tokens=("<|end_of_text|>",),
    ),
}

_MODEL_TYPES = {
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen3ForCausalLM": "qwen3",
}


def write_random_causal_lm(
    dest: Path,
    *,
    architecture: str = "Qwen2ForCausalLM",
    tokenizer: TokenizerKind = "qwen2",
    chat_template: bool = True,
    shape: TinyShape = TinyShape(),
    added_tokens: Sequence[str] = (),
    seed: int = 0,
    max_position_embeddings: int | None = None,
    config: Mapping[str, Any] | None = None,
    dtype: str = "float32",
    text_tokens: int | None = None,
) -> None:
    """Write config.json, model.safetensors, generation_config.json and a tokenizer for a random causal LM.

    ``tokenizer``: its kind (:data:`TokenizerKind`), written by :func:`write_tokenizer`; the model's special token
    ids follow it, and config.json takes the family's RoPE base, embedding tying, position limit and norm epsilon
    (Qwen2: 10⁶, tied, 4096, 10⁻⁶; Llama 2: 10⁴, untied, 4096, 10⁻⁵; Llama 3: 5·10⁵, untied, 8192, 10⁻⁵).
    ``chat_template``: an instruct model's tokenizer (a Llama 3 Instruct's generation_config.json then ends answers
    at ``<|eot_id|>`` and ``<|end_of_text|>``). ``max_position_embeddings`` and ``config`` (any config.json value:
    ``rope_theta``, ``tie_word_embeddings``, ``num_key_value_heads``, ``rope_scaling``, …) override what ``shape``
    and the family give. ``text_tokens``: the tokenizer's vocabulary is padded to that many tokens (see
    :func:`write_bpe_tokenizer`).
    """
    import torch
    import transformers
    from transformers import AutoTokenizer

    if architecture not in _MODEL_TYPES:
        raise ValueError(f"unknown architecture {architecture!r} (one of {', '.join(_MODEL_TYPES)})")
    tokenizer_size = write_tokenizer(
        dest, tokenizer, chat_template=chat_template, added_tokens=added_tokens, pad_vocab_to=text_tokens
    )
    family = _FAMILIES[tokenizer]
    loaded = AutoTokenizer.from_pretrained(str(dest), local_files_only=True)
    values = {
        "vocab_size": max(shape.vocab_size, -(-tokenizer_size // 64) * 64),
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "max_position_embeddings": max_position_embeddings or family.max_position_embeddings,
        "rope_theta": family.rope_theta,
        "tie_word_embeddings": family.tie_word_embeddings,
        "rms_norm_eps": family.rms_norm_eps,
        "bos_token_id": loaded.bos_token_id,
        "eos_token_id": loaded.eos_token_id,
        "pad_token_id": loaded.pad_token_id,
        "architectures": [architecture],
        **(config or {}),
    }
    model_config = transformers.AutoConfig.for_model(_MODEL_TYPES[architecture], **values)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(model_config).to(getattr(torch, dtype))
    if chat_template and family.instruct_end_tokens:
        extra = loaded.convert_tokens_to_ids(list(family.instruct_end_tokens))
        model.generation_config.eos_token_id = [*extra, loaded.eos_token_id]
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(str(dest), safe_serialization=True)
