"""A tiny random-weight Whisper checkpoint in the Hugging Face layout, with Whisper's real vocabulary layout.

The folder holds what an ``openai/whisper-*`` repository holds: ``config.json`` and ``model.safetensors``
(``WhisperForConditionalGeneration``), ``generation_config.json``, ``preprocessor_config.json``
(``WhisperFeatureExtractor``), ``tokenizer.json`` with ``tokenizer_config.json``, ``vocab.json`` and ``merges.txt``.

The vocabulary has the real ids (:mod:`.tokens`): a byte-level BPE whose merges are learnt from the sentences in
``sentences.txt`` (so English text really tokenizes and decodes), inert filler entries up to id 50256 that no text
tokenizes to, then the special, language, task and timestamp tokens: 51865 ids with 80 mel bins (99 languages, as
large-v2), 51866 with 128 (100 languages, as large-v3).

The random model is made to speak: its weights are drawn wide enough (``init_std``) that what it says depends on
the audio, and the output projection (tied to the decoder's embeddings) has zero rows for the fillers, the byte
tokens that are not printable ASCII and the timestamps, and small ones for the special tokens, so greedy decoding
picks printable text and a window's transcript runs to its token cap. ``generation_config.json`` suppresses
nothing, so transformers' ``generate`` is plain greedy decoding, as TensorRT-LLM's is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

from .tokens import END_OF_TEXT, FIRST_SPECIAL_ID, NO_TIMESTAMPS, START_OF_PREVIOUS, START_OF_TRANSCRIPT, special_tokens

#: Languages of the 80-mel (large-v2 and before) and 128-mel (large-v3 on) vocabularies.
LANGUAGE_COUNTS = {80: 99, 128: 100}
#: Entries of the learnt BPE: the 256 bytes and the merges learnt from ``sentences.txt``.
LEARNT_VOCAB_SIZE = 768
#: Scale of the special tokens' embedding rows (small: greedy decoding prefers text, but the prompt's tokens differ).
SPECIAL_ROW_SCALE = 0.1
#: Standard deviation of the random weights: at transformers' 0.02 the tiny model says one word whatever it hears.
INIT_STD = 0.3


@dataclass(frozen=True)
class TinyWhisper:
    """Layer sizes of the random model; tiny so CPU tests stay fast."""

    d_model: int = 64
    encoder_layers: int = 2
    decoder_layers: int = 2
    attention_heads: int = 4
    #: 4 x d_model, as in every released Whisper (openai-whisper's checkpoint format, which TensorRT-LLM's
    #: converter reads, assumes it)
    ffn_dim: int = 256


def write_random_checkpoint(dest: Path, *, seed: int = 0, n_mels: int = 80, shape: TinyWhisper = TinyWhisper()) -> None:
    """Write a random ``WhisperForConditionalGeneration`` with ``n_mels`` mel bins (80 or 128) into ``dest``."""
    import torch
    import transformers
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    if n_mels not in LANGUAGE_COUNTS:
        raise ValueError(f"n_mels must be one of {sorted(LANGUAGE_COUNTS)}, got {n_mels}")
    languages = list(LANGUAGES)[: LANGUAGE_COUNTS[n_mels]]
    specials = special_tokens(languages, no_speech="<|nocaptions|>" if n_mels == 80 else "<|nospeech|>")
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _write_tokenizer(dest, specials)
    token_id = {name: tokenizer.token_to_id(name) for name in specials}
    vocab_size = FIRST_SPECIAL_ID + len(specials)
    end = token_id[END_OF_TEXT]
    config = transformers.WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=n_mels,
        d_model=shape.d_model,
        encoder_layers=shape.encoder_layers,
        decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.attention_heads,
        decoder_attention_heads=shape.attention_heads,
        encoder_ffn_dim=shape.ffn_dim,
        decoder_ffn_dim=shape.ffn_dim,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=token_id[START_OF_TRANSCRIPT],
        bos_token_id=end,
        eos_token_id=end,
        pad_token_id=end,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        init_std=INIT_STD,
        architectures=["WhisperForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(config)
    embeddings = model.get_decoder().embed_tokens.weight
    unprintable = [index for index in range(LEARNT_VOCAB_SIZE) if not _printable(tokenizer.decode([index]))]
    with torch.no_grad():
        embeddings[unprintable] = 0
        embeddings[LEARNT_VOCAB_SIZE:FIRST_SPECIAL_ID] = 0  # fillers
        embeddings[FIRST_SPECIAL_ID:] *= SPECIAL_ROW_SCALE
        embeddings[token_id["<|0.00|>"] :] = 0  # timestamps
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(str(dest), safe_serialization=True)
    (dest / "generation_config.json").write_text(json.dumps(_generation_config(token_id, languages), indent=2) + "\n")
    transformers.WhisperFeatureExtractor(feature_size=n_mels).save_pretrained(str(dest))


def _printable(text: str) -> bool:
    return text.isascii() and text.isprintable()


def _write_tokenizer(dest: Path, specials: list[str]) -> Tokenizer:
    """Write tokenizer.json (+ tokenizer_config.json, vocab.json, merges.txt) and return it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    sentences = files(__package__).joinpath("sentences.txt").read_text(encoding="utf-8").splitlines()
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNT_VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    learner.train_from_iterator(sentences, trainer)
    learnt = json.loads(learner.to_str())["model"]
    vocab: dict[str, int] = dict(learnt["vocab"])
    if len(vocab) != LEARNT_VOCAB_SIZE:
        raise RuntimeError(f"the BPE learnt {len(vocab)} entries from sentences.txt, expected {LEARNT_VOCAB_SIZE}")
    # fillers: pre-tokenized apart ("<", "filler", digits, ">") and built by no merge, so no text becomes one
    vocab.update({f"<filler{index}>": index for index in range(len(vocab), FIRST_SPECIAL_ID)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(pair) for pair in learnt["merges"]]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    timestamps = [name for name in specials if name[2:3].isdigit()]
    tokenizer.add_special_tokens([AddedToken(name, normalized=False) for name in specials if name not in timestamps])
    tokenizer.add_tokens([AddedToken(name, normalized=False, special=False) for name in timestamps])
    token_id = {name: tokenizer.token_to_id(name) for name in specials}
    if token_id[END_OF_TEXT] != FIRST_SPECIAL_ID or tokenizer.get_vocab_size() != FIRST_SPECIAL_ID + len(specials):
        raise RuntimeError("the special tokens did not land at Whisper's ids")
    # as the published tokenizer.json: the default prompt before the text, the end after it
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{START_OF_TRANSCRIPT} {NO_TIMESTAMPS} $A:0 {END_OF_TEXT}",
        pair=f"{START_OF_TRANSCRIPT} {NO_TIMESTAMPS} $A:0 $B:1 {END_OF_TEXT}",
        special_tokens=[(name, token_id[name]) for name in (START_OF_TRANSCRIPT, NO_TIMESTAMPS, END_OF_TEXT)],
    )
    tokenizer.save(str(dest / "tokenizer.json"))
    tokenizer.model.save(str(dest))
    config = {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": END_OF_TEXT,
        "eos_token": END_OF_TEXT,
        "unk_token": END_OF_TEXT,
        "pad_token": END_OF_TEXT,
        "model_max_length": 1024,
        "add_prefix_space": False,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer


def _generation_config(token_id: dict[str, int], languages: list[str]) -> dict[str, Any]:
    """The keys of a published generation_config.json that transformers' Whisper ``generate`` reads."""
    end = token_id[END_OF_TEXT]
    return {
        "decoder_start_token_id": token_id[START_OF_TRANSCRIPT],
        "bos_token_id": end,
        "eos_token_id": end,
        "pad_token_id": end,
        "max_length": 448,
        "is_multilingual": True,
        "lang_to_id": {f"<|{code}|>": token_id[f"<|{code}|>"] for code in languages},
        "task_to_id": {task: token_id[f"<|{task}|>"] for task in ("transcribe", "translate")},
        "no_timestamps_token_id": token_id[NO_TIMESTAMPS],
        "prev_sot_token_id": token_id[START_OF_PREVIOUS],
        "return_timestamps": False,
    }
