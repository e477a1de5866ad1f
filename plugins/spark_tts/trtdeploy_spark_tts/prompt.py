"""Spark-TTS's LLM prompt and its special tokens: building the prompt ids, reading semantic tokens back.

The prompt is the official one (voice cloning): ``<|task_tts|><|start_content|>`` reference text + target text
``<|end_content|><|start_global_token|>`` 32 global tokens ``<|end_global_token|><|start_semantic_token|>`` and the
reference's semantic tokens. Without a reference text, the semantic prompt is left out (the official prompt for
cloning from the audio alone). The LLM answers with ``<|bicodec_semantic_N|>`` tokens until its end-of-sequence.

Global and semantic tokens are turned into ids through lookup tables built once from the tokenizer, instead of
spelling ~1,500 special tokens out as text and tokenizing them per request (the text part is tokenized alone: added
tokens split text before BPE runs, so the ids are the same).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

#: Codebook sizes: semantic tokens (BiCodec's factorized VQ) and global tokens (its speaker FSQ, 4**6).
SEMANTIC_CODES = 8192
GLOBAL_CODES = 4096
#: Global tokens per utterance, and semantic tokens per second of 16 kHz audio (320 samples each).
GLOBAL_TOKENS = 32
TOKENS_PER_SECOND = 50
SAMPLES_PER_TOKEN = 320
SAMPLE_RATE = 16000

TASK_TTS = "<|task_tts|>"
START_CONTENT = "<|start_content|>"
END_CONTENT = "<|end_content|>"
START_GLOBAL = "<|start_global_token|>"
END_GLOBAL = "<|end_global_token|>"
START_SEMANTIC = "<|start_semantic_token|>"
END_SEMANTIC = "<|end_semantic_token|>"
#: The structural tokens of the prompt (the real tokenizer also has task, gender, pitch and speed tokens for the
#: controllable mode, which this deployment does not use).
STRUCTURE_TOKENS = (TASK_TTS, START_CONTENT, END_CONTENT, START_GLOBAL, END_GLOBAL, START_SEMANTIC, END_SEMANTIC)


def semantic_token(code: int) -> str:
    return f"<|bicodec_semantic_{code}|>"


def global_token(code: int) -> str:
    return f"<|bicodec_global_{code}|>"


def added_tokens() -> list[str]:
    """Every special token the prompt uses, in the order the random-weight tokenizer adds them."""
    return [
        *STRUCTURE_TOKENS,
        *(global_token(code) for code in range(GLOBAL_CODES)),
        *(semantic_token(code) for code in range(SEMANTIC_CODES)),
    ]


def _token_text(value: str | Mapping[str, str] | None) -> str | None:
    """A special token from tokenizer_config.json: a string, or an AddedToken dict."""
    return value.get("content") if isinstance(value, Mapping) else value


class PromptCodec:
    """Token ids of Spark-TTS prompts, and semantic codes of LLM output ids, for one tokenizer.

    Built from the ``tokenizers`` library alone (:meth:`load`), so a BLS instance starts without importing
    transformers: the ids are those of the checkpoint's fast tokenizer, which is this same ``tokenizer.json``.
    """

    def __init__(self, vocab: Mapping[str, int], encode: Callable[[str], list[int]], eos_id: int, pad_id: int) -> None:
        self.encode = encode
        missing = [token for token in (*STRUCTURE_TOKENS, global_token(0), semantic_token(0)) if token not in vocab]
        if missing:
            raise ValueError(f"the LLM tokenizer lacks Spark-TTS's special tokens ({', '.join(missing)})")
        self.global_ids = np.array([vocab[global_token(code)] for code in range(GLOBAL_CODES)], dtype=np.int32)
        self.semantic_ids = np.array([vocab[semantic_token(code)] for code in range(SEMANTIC_CODES)], dtype=np.int32)
        #: id -> semantic code, -1 for every other token
        self.code_of_id = np.full(max(vocab.values()) + 1, -1, dtype=np.int32)
        self.code_of_id[self.semantic_ids] = np.arange(SEMANTIC_CODES, dtype=np.int32)
        self._end_global_start_semantic = [vocab[END_GLOBAL], vocab[START_SEMANTIC]]
        self.eos_id = eos_id
        self.pad_id = pad_id

    @classmethod
    def load(cls, llm_dir: str | Path) -> PromptCodec:
        """The codec of the tokenizer in ``llm_dir`` (``tokenizer.json`` + ``tokenizer_config.json``)."""
        from tokenizers import Tokenizer

        llm_dir = Path(llm_dir)
        tokenizer = Tokenizer.from_file(str(llm_dir / "tokenizer.json"))
        config = json.loads((llm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        eos = _token_text(config.get("eos_token"))
        if eos not in vocab:
            raise ValueError(f"{llm_dir}: the eos token {eos!r} of tokenizer_config.json is not in the vocabulary")
        pad = _token_text(config.get("pad_token"))
        return cls(
            vocab,
            lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
            eos_id=vocab[eos],
            pad_id=vocab.get(pad, vocab[eos]),
        )

    def text_ids(self, reference_text: str, target_text: str) -> list[int]:
        """The prompt up to and including ``<|start_global_token|>``."""
        return list(self.encode(f"{TASK_TTS}{START_CONTENT}{reference_text}{target_text}{END_CONTENT}{START_GLOBAL}"))

    def prompt_ids(
        self, text_ids: Sequence[int], global_codes: np.ndarray, semantic_codes: np.ndarray | None
    ) -> np.ndarray:
        """The whole prompt: ``text_ids``, the global tokens, and (with a reference text) the semantic prompt."""
        parts = [np.asarray(text_ids, dtype=np.int32), self.global_ids[np.asarray(global_codes)]]
        if semantic_codes is None:
            parts.append(np.asarray(self._end_global_start_semantic[:1], dtype=np.int32))
        else:
            parts.append(np.asarray(self._end_global_start_semantic, dtype=np.int32))
            parts.append(self.semantic_ids[np.asarray(semantic_codes)])
        return np.concatenate(parts)

    def semantic_codes(self, output_ids: np.ndarray) -> np.ndarray:
        """The semantic codes among generated ids, in order (other tokens, e.g. a stray text token, are dropped)."""
        ids = np.asarray(output_ids, dtype=np.int64).reshape(-1)
        ids = ids[(ids >= 0) & (ids < self.code_of_id.size)]
        codes = self.code_of_id[ids]
        return codes[codes >= 0]

    def prompt_length(self, text_ids: Sequence[int], semantic_tokens: int | None) -> int:
        """Length of the prompt :meth:`prompt_ids` makes, without making it."""
        tail = 1 if semantic_tokens is None else 2 + semantic_tokens
        return len(text_ids) + GLOBAL_TOKENS + tail


def semantic_tokens_for(samples: int) -> int:
    """How many semantic tokens BiCodec makes of ``samples`` samples of 16 kHz audio (an upper bound)."""
    return -(-samples // SAMPLES_PER_TOKEN)
