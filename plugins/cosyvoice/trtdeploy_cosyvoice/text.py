"""Text normalisation before the LLM: numbers, dates, units and symbols written out as they are spoken.

CosyVoice's LLM reads digits and symbols poorly ("5499" or "5g" come out garbled), and the official front end
normalises the target text first. This uses ``wetext`` (its text-normalisation grammars ship inside the wheel, so
nothing is downloaded), choosing its grammar per text as the official front end does: Chinese for a text with any
CJK character or of digits alone, English otherwise. Without wetext installed, text passes through unchanged.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any

_CJK = re.compile(r"[\u4e00-\u9fff]")


def is_chinese(text: str) -> bool:
    """Whether the Chinese grammar reads ``text``: any CJK character, or digits alone."""
    return bool(_CJK.search(text)) or text.strip().isdigit()


class TextNormalizer:
    """wetext's Chinese and English normalisers, each loaded on first use (about 0.2 s) or by :meth:`load`;
    :attr:`available` is False (and text passes unchanged) where wetext does not install."""

    def __init__(self) -> None:
        try:
            import wetext  # noqa: F401
        except ImportError:
            self.available = False
        else:
            self.available = True

    @cached_property
    def _chinese(self) -> Any:
        from wetext import Normalizer

        return Normalizer(lang="zh", operator="tn", remove_erhua=False)

    @cached_property
    def _english(self) -> Any:
        from wetext import Normalizer

        return Normalizer(lang="en", operator="tn")

    def load(self) -> None:
        """Load both grammars now (a server does it before its first request)."""
        if self.available:
            self._chinese, self._english  # noqa: B018

    def __call__(self, text: str) -> str:
        if not self.available or not text.strip():
            return text
        return (self._chinese if is_chinese(text) else self._english).normalize(text)
