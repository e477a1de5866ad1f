"""Whisper's token layout and the text side of a request: the decoder prompt from ``TEXT_PREFIX``, the transcript
from the generated ids.

Every Whisper vocabulary is a byte-level BPE (ids 0 … 50256) followed by the special tokens, in this order:
``<|endoftext|>`` (50257), ``<|startoftranscript|>``, one ``<|xx|>`` per language (99, or 100 from large-v3 on),
``<|translate|>``, ``<|transcribe|>``, ``<|startoflm|>``, ``<|startofprev|>``, ``<|nocaptions|>`` (``<|nospeech|>``
from large-v3 on), ``<|notimestamps|>``, then 1501 timestamps ``<|0.00|>`` … ``<|30.00|>``. English-only models
(``*.en``) have no language or task tokens. Tokens are looked up by name in the checkpoint's ``tokenizer.json``, so
every layout works; only the order above is assumed, by :func:`special_tokens` (the random checkpoint).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

END_OF_TEXT = "<|endoftext|>"
START_OF_TRANSCRIPT = "<|startoftranscript|>"
START_OF_PREVIOUS = "<|startofprev|>"
NO_TIMESTAMPS = "<|notimestamps|>"
TASKS = ("transcribe", "translate")
#: Where the BPE vocabulary ends: ``<|endoftext|>`` is the first special token of every Whisper vocabulary.
FIRST_SPECIAL_ID = 50257
#: Timestamps 0.00 … 30.00 s in steps of 20 ms.
TIMESTAMPS = tuple(f"<|{step * 0.02:.2f}|>" for step in range(1501))

_TOKEN_PATTERN = re.compile(r"<\|[^|<>]*\|>")


def special_tokens(languages: Sequence[str], *, no_speech: str = "<|nocaptions|>") -> list[str]:
    """The special tokens after the BPE vocabulary, in Whisper's order, for these language codes."""
    return [
        END_OF_TEXT,
        START_OF_TRANSCRIPT,
        *(f"<|{code}|>" for code in languages),
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        START_OF_PREVIOUS,
        no_speech,
        NO_TIMESTAMPS,
        *TIMESTAMPS,
    ]


class PromptError(ValueError):
    """A ``TEXT_PREFIX`` this model cannot take (answered with an error response naming the problem)."""


class WhisperText:
    """The checkpoint's tokenizer as the BLS uses it: prefixes to decoder prompts, generated ids to text."""

    def __init__(self, tokenizer_file: Path | str, *, language: str = "en", task: str = "transcribe") -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.special = {
            token.content: index for index, token in self.tokenizer.get_added_tokens_decoder().items()
        }  # fmt: skip
        missing = [name for name in (END_OF_TEXT, START_OF_TRANSCRIPT) if name not in self.special]
        if missing:
            raise ValueError(f"{tokenizer_file} has no {' or '.join(missing)}: is it a Whisper tokenizer?")
        self.end_id = self.special[END_OF_TEXT]
        self.languages = [name[2:-2] for name in self.special if _is_language(name)]
        self.default_prefix = self.prefix_for(language, task)

    def prefix_for(self, language: str, task: str) -> str:
        """The decoder prompt text for a language and task; English-only models take neither."""
        if not self.languages:
            return START_OF_TRANSCRIPT + NO_TIMESTAMPS
        if language not in self.languages:
            raise PromptError(f"language {language!r} is not one of this model's {len(self.languages)} languages")
        if task not in TASKS:
            raise PromptError(f"task {task!r} is neither {' nor '.join(TASKS)}")
        return f"{START_OF_TRANSCRIPT}<|{language}|><|{task}|>{NO_TIMESTAMPS}"

    def prompt_ids(self, prefix: str) -> np.ndarray:
        """The decoder prompt for ``TEXT_PREFIX`` (the default one when empty); PromptError when a ``<|…|>`` in it is
        not a token of this model (an unknown language) or it has no ``<|startoftranscript|>``."""
        prefix = prefix.strip() or self.default_prefix
        unknown = [name for name in _TOKEN_PATTERN.findall(prefix) if name not in self.special]
        if unknown:
            known = ", ".join(f"<|{code}|>" for code in self.languages[:5])
            languages = f"its {len(self.languages)} languages are {known}, …" if self.languages else "English only"
            raise PromptError(f"TEXT_PREFIX names {unknown[0]}, which is not a token of this model ({languages})")
        if START_OF_TRANSCRIPT not in prefix:
            raise PromptError(
                f"TEXT_PREFIX {prefix!r} has no {START_OF_TRANSCRIPT}: send e.g. {self.default_prefix!r}, with an "
                f"optional {START_OF_PREVIOUS} text prompt before it, or an empty prefix"
            )
        return np.asarray(self.tokenizer.encode(prefix, add_special_tokens=False).ids, dtype=np.int32)

    def transcript(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of generated ids: special tokens (every id from ``<|endoftext|>`` on: timestamps, languages …)
        dropped, surrounding spaces stripped."""
        text_ids = [int(index) for index in ids if 0 <= int(index) < self.end_id]
        return self.tokenizer.decode(text_ids, skip_special_tokens=False).strip()


def _is_language(name: str) -> bool:
    code = name[2:-2]
    return code.isalpha() and code.islower() and 2 <= len(code) <= 3
