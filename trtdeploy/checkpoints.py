"""Random-weight checkpoints of real architectures, in the real Hugging Face on-disk layout.

Tests and offline trials need a model that loads and runs like the real one without the Hub: the weights are
noise, the layout, config and tokenizer behave like the published checkpoint's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

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
    if pad_vocab_to is not None and pad_vocab_to > tokenizer.get_vocab_size():
        data = json.loads(tokenizer.to_str())
        vocab = data["model"]["vocab"]
        vocab.update({f"<|filler_{index}|>": index for index in range(len(vocab), pad_vocab_to)})
        tokenizer = Tokenizer.from_str(json.dumps(data))
    if added_tokens:
        tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in added_tokens])
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


def write_random_causal_lm(
    dest: Path,
    *,
    architecture: str = "Qwen2ForCausalLM",
    shape: TinyShape = TinyShape(),
    added_tokens: Sequence[str] = (),
    seed: int = 0,
    max_position_embeddings: int = 4096,
    dtype: str = "float32",
    text_tokens: int | None = None,
) -> None:
    """Write config.json, model.safetensors, generation_config.json and a tokenizer for a random causal LM.

    ``text_tokens``: the tokenizer's vocabulary is padded to that many tokens (see :func:`write_bpe_tokenizer`).
    """
    import torch
    import transformers

    tokenizer_size = write_bpe_tokenizer(dest, added_tokens=added_tokens, pad_vocab_to=text_tokens)
    vocab_size = max(shape.vocab_size, -(-tokenizer_size // 64) * 64)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(dest), local_files_only=True)
    model_type = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}[architecture]
    config = transformers.AutoConfig.for_model(
        model_type,
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        architectures=[architecture],
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype))
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(str(dest), safe_serialization=True)
