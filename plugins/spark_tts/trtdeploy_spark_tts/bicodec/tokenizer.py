"""Spark-TTS's audio tokenizer: 16 kHz waveforms to (global, semantic) tokens, batched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import yaml

from .codec import BiCodec
from .features import SpeechFeatures

WAV2VEC2_FOLDER = "wav2vec2-large-xlsr-53"
_TARGET_LOUDNESS = 0.2
_QUIET_PEAK = 0.1


def normalize_volume(wav: np.ndarray) -> np.ndarray:
    """The official loudness normalization, in float64.

    A clip whose peak is under 0.1 is first scaled so that the peak is 0.1. Then loudness is the mean magnitude of
    the 90th to 99th percentile of the samples louder than 0.01 (measured on the clip as given, before that first
    scaling, as the official code does), the clip is scaled toward loudness 0.2 by a factor clipped to [0.1, 10],
    and scaled down again if that takes its peak over 1. Clips with 10 or fewer samples louder than 0.01 only get the
    first step.
    """
    wav = np.asarray(wav, dtype=np.float64)
    magnitudes = np.sort(np.abs(wav))
    peak = magnitudes[-1]
    if peak < _QUIET_PEAK:
        wav = wav / max(peak, 1e-3) * _QUIET_PEAK
    audible = magnitudes[magnitudes > 0.01]
    if len(audible) <= 10:
        return wav
    loudness = np.mean(audible[int(0.9 * len(audible)) : int(0.99 * len(audible))])
    wav = wav * np.clip(_TARGET_LOUDNESS / loudness, 0.1, 10)
    peak = np.max(np.abs(wav))
    return wav / peak if peak > 1 else wav


def reference_clip(wav: np.ndarray, length: int) -> np.ndarray:
    """The first ``length`` samples, the clip repeated end to end first if it is shorter."""
    if len(wav) < length:
        wav = np.tile(wav, length // len(wav) + 1)
    return wav[:length]


class AudioTokenizer:
    """Batched ``BiCodecTokenizer.tokenize`` of the official code, on waveforms instead of files.

    As the official path does (its ``tokenize`` loads audio through ``process_audio``, which normalizes volume when
    the checkpoint's ``config.yaml`` says ``volume_normalize: true``), each waveform is volume-normalized first; the
    semantic tokens come from the whole waveform, the global tokens from its reference clip.

    On CPU a batch gives each waveform exactly the tokens it gets alone. On a GPU, TF32 convolutions (cuDNN's default)
    make batched and single features differ by about 1e-3, which flips a semantic token now and then; a process that
    needs exact agreement sets ``torch.backends.cudnn.allow_tf32 = False`` (it costs about 1 ms on 10 s of audio).
    """

    def __init__(self, codec: BiCodec, features: SpeechFeatures, *, ref_clip_samples: int, volume_normalize: bool):
        if codec.config.encoder.input_channels != features.hidden_size:
            expected = codec.config.encoder.input_channels
            raise ValueError(f"BiCodec reads {expected}-wide features, wav2vec2 gives {features.hidden_size}")
        self.codec = codec
        self.features = features
        self.ref_clip_samples = ref_clip_samples
        self.volume_normalize = volume_normalize

    @classmethod
    def load(cls, checkpoint_dir: str | Path, *, device: str | torch.device = "cpu") -> AudioTokenizer:
        """Reads the checkpoint's ``config.yaml``, ``BiCodec/`` and ``wav2vec2-large-xlsr-53/``."""
        root = Path(checkpoint_dir)
        settings = yaml.safe_load((root / "config.yaml").read_text())
        codec = BiCodec.load(root / "BiCodec", device=device, parts=("tokenizer",))
        if settings["sample_rate"] != codec.config.mel_params.sample_rate:
            raise ValueError(f"config.yaml sample_rate {settings['sample_rate']} differs from BiCodec's")
        hop = settings["latent_hop_length"]
        ref_clip_samples = int(settings["sample_rate"] * settings["ref_segment_duration"]) // hop * hop
        features = SpeechFeatures.load(root / WAV2VEC2_FOLDER, device=device)
        return cls(codec, features, ref_clip_samples=ref_clip_samples, volume_normalize=settings["volume_normalize"])

    def tokenize(self, wavs: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """16 kHz mono float32 waveforms (any lengths) to ``(global int32 [32], semantic int32 [T])`` each, T being
        the wav2vec2 frame count (about one per 320 samples). A batch gives each waveform the tokens it gets alone."""
        if self.volume_normalize:
            wavs = [normalize_volume(wav) for wav in wavs]
        wavs = [np.asarray(wav, dtype=np.float32) for wav in wavs]
        references = torch.from_numpy(np.stack([reference_clip(wav, self.ref_clip_samples) for wav in wavs]))
        features, lengths = self.features(wavs)
        semantic, global_ = self.codec.tokenize(features, lengths, references)
        semantic, global_ = semantic.int().cpu().numpy(), global_.int().cpu().numpy()
        return [(global_[row], semantic[row, :length]) for row, length in enumerate(lengths.tolist())]
