"""Our implementation of Spark-TTS's BiCodec audio codec and audio tokenizer, loading the official checkpoint.

The torch-based classes are imported on first use, so that the configuration (and the vocoder's receptive radius,
which the BLS models need) is available without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import BiCodecConfig, vocoder_receptive_radius

if TYPE_CHECKING:
    from .checkpoint import write_random_checkpoint_parts
    from .codec import BiCodec
    from .features import SpeechFeatures
    from .tokenizer import AudioTokenizer

#: Public names defined in submodules that import torch, by submodule.
_LAZY = {
    "AudioTokenizer": "tokenizer",
    "BiCodec": "codec",
    "SpeechFeatures": "features",
    "write_random_checkpoint_parts": "checkpoint",
}

__all__ = [
    "AudioTokenizer",
    "BiCodec",
    "BiCodecConfig",
    "SpeechFeatures",
    "vocoder_receptive_radius",
    "write_random_checkpoint_parts",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
