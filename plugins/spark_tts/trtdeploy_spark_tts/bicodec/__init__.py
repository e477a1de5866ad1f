"""Our implementation of Spark-TTS's BiCodec audio codec and audio tokenizer, loading the official checkpoint."""

from .checkpoint import write_random_checkpoint_parts
from .codec import BiCodec, vocoder_receptive_radius
from .config import BiCodecConfig
from .features import SpeechFeatures
from .tokenizer import AudioTokenizer

__all__ = [
    "AudioTokenizer",
    "BiCodec",
    "BiCodecConfig",
    "SpeechFeatures",
    "vocoder_receptive_radius",
    "write_random_checkpoint_parts",
]
