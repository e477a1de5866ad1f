"""Spark-TTS's LLM prompt and its special tokens: building the prompt ids, reading semantic tokens back.

The prompt is the official one (voice cloning): ``<|task_tts|><|start_content|>`` reference text + target text
``<|end_content|><|start_global_token|>`` 32 global tokens ``<|end_global_token|><|start_semantic_token|>`` and the
reference's semantic tokens. Without a reference text, the semantic prompt is left out (the official prompt for
cloning from the audio alone). The LLM answers with ``<|bicodec_semantic_N|>`` tokens until its end-of-sequence.

Global and semantic tokens are turned into ids through lookup tables built once from the tokenizer, instead of
spelling ~1,500 special tokens out as text and tokenizing them per request (the text part is tokenized alone: added
tokens split text before BPE runs, so the ids are the same). As in the official BLS (``tokenizer([prompt])``), the
tokenizer's default special-token handling applies: whatever its post-processor puts around a sequence (nothing
for Spark-TTS's Qwen2 tokenizer; a BOS for some) is put around the whole prompt.

The end token: the official CLI stops where transformers' ``generate`` does, on the model's ``eos_token_id``
(generation_config.json, else config.json: 151645 for Spark-TTS-0.5B); the official Triton BLS on the tokenizer's
``eos_token``. They agree for the released checkpoint. Where they differ, the model's own is used: it is what the
model was run with by its authors, and the tokenizer's is a text-processing setting (:func:`end_token`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

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

    def __init__(
        self,
        vocab: Mapping[str, int],
        encode: Callable[[str], list[int]],
        eos_id: int,
        pad_id: int,
        around: tuple[Sequence[int], Sequence[int]] = ((), ()),
    ) -> None:
        self.encode = encode
        #: The ids the tokenizer's post-processor puts before and after a sequence.
        self.prefix_ids, self.suffix_ids = (list(ids) for ids in around)
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
        pad = _token_text(config.get("pad_token"))
        eos_id, _ = end_token(llm_dir, vocab)
        return cls(
            vocab,
            lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
            eos_id=eos_id,
            pad_id=vocab.get(pad, eos_id),
            around=_post_processor_ids(tokenizer),
        )

    def text_ids(self, reference_text: str, target_text: str) -> list[int]:
        """The prompt up to and including ``<|start_global_token|>``."""
        text = f"{TASK_TTS}{START_CONTENT}{reference_text}{target_text}{END_CONTENT}{START_GLOBAL}"
        return [*self.prefix_ids, *self.encode(text)]

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
        parts.append(np.asarray(self.suffix_ids, dtype=np.int32))
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
        return len(text_ids) + GLOBAL_TOKENS + tail + len(self.suffix_ids)


def semantic_tokens_for(samples: int) -> int:
    """How many semantic tokens BiCodec makes of ``samples`` samples of 16 kHz audio (an upper bound)."""
    return -(-samples // SAMPLES_PER_TOKEN)


def _post_processor_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer adds before and after a sequence when asked for its special tokens."""
    probe = "a"
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    full = tokenizer.encode(probe, add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    raise ValueError("the tokenizer's post-processor rewrites the text itself: Spark-TTS prompts cannot be built")


def end_token(llm_dir: str | Path, vocab: Mapping[str, int]) -> tuple[int, str | None]:
    """The id the LLM's answer ends on (see the module docstring), and a note when the model's end-of-sequence id
    and the tokenizer's ``eos_token`` disagree (None when they agree)."""
    llm_dir = Path(llm_dir)
    config = json.loads((llm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    eos = _token_text(config.get("eos_token"))
    tokenizer_eos = vocab.get(eos) if eos is not None else None
    model_eos: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = llm_dir / name
        found = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id") if path.is_file() else None
        if found is not None:
            model_eos = found if isinstance(found, list) else [found]
            source = name
            break
    if not model_eos:
        if tokenizer_eos is None:
            raise ValueError(f"{llm_dir}: neither config.json nor tokenizer_config.json names an end-of-sequence token")
        return tokenizer_eos, None
    if tokenizer_eos in model_eos:
        return tokenizer_eos, None
    note = (
        f"the LLM ends on id {model_eos[0]} ({source} eos_token_id, which the official CLI stops on), not on "
        f"tokenizer_config.json's eos_token {eos!r} "
        f"({'not in the vocabulary' if tokenizer_eos is None else f'id {tokenizer_eos}'}, which the official Triton "
        "BLS sends): "
        "the model's own end token is the one it was run with"
    )
    return model_eos[0], note
