"""The audio side of a request: checking the samples, cutting them into windows, and their log-mel features.

Features are what transformers' ``WhisperFeatureExtractor`` computes from the checkpoint's
``preprocessor_config.json``, as openai-whisper does: the window is padded with zeros to 30 s *before* the STFT
(n_fft 400, hop 160, Hann), then mel filters, log10, clamped to 8 below the maximum, scaled by (x + 4) / 4. The
official TensorRT-LLM ``whisper_bls`` pads with zero frames *after* the log-mel instead, which gives the padded
frames other values than the model was trained on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The only rate Whisper takes.
SAMPLE_RATE = 16000
#: Samples of one encoder window (30 s), and its mel frames.
WINDOW_SAMPLES = 30 * SAMPLE_RATE
WINDOW_FRAMES = 3000

#: config.pbtxt data types of ``encoder_input_features`` and their numpy types.
FEATURE_DTYPES = {"TYPE_FP16": np.float16, "TYPE_FP32": np.float32}


class AudioError(ValueError):
    """Samples this model cannot take (answered with an error response naming the problem)."""


def utterances(wav: np.ndarray, lengths: np.ndarray | None, max_samples: int) -> list[np.ndarray]:
    """The rows of ``WAV`` ([N, samples]) cut to their ``WAV_LENS`` (the whole row when not sent), each checked:
    not empty, finite, at most ``max_samples`` long."""
    if wav.ndim != 2:
        raise AudioError(f"WAV must be [batch, samples], got shape {list(wav.shape)}")
    if lengths is None:
        lengths = np.full(wav.shape[0], wav.shape[1])
    lengths = lengths.reshape(-1)
    if lengths.size != wav.shape[0]:
        raise AudioError(f"WAV_LENS has {lengths.size} values for {wav.shape[0]} rows of WAV")
    rows = []
    for row, length in zip(wav, lengths.tolist(), strict=True):
        if length > row.size:
            raise AudioError(f"WAV_LENS {length} is more than the {row.size} samples WAV holds")
        if length <= 0:
            raise AudioError(f"the audio is empty (WAV_LENS {length}, WAV holds {row.size} samples): send some speech")
        if length > max_samples:
            raise AudioError(
                f"the audio is {length / SAMPLE_RATE:.1f} s, more than this deployment's max_audio_seconds "
                f"{max_samples / SAMPLE_RATE:g}: split it, or rebuild with a larger -o max_audio_seconds"
            )
        samples = row[:length].astype(np.float32, copy=False)
        if not np.isfinite(samples).all():
            raise AudioError("WAV holds NaN or infinite samples: send finite 16 kHz samples (e.g. in -1..1)")
        rows.append(samples)
    return rows


def windows(samples: np.ndarray, window_samples: int) -> list[np.ndarray]:
    """Consecutive windows of ``window_samples`` (the last one shorter), each transcribed on its own."""
    return [samples[start : start + window_samples] for start in range(0, samples.size, window_samples)]


class LogMel:
    """Log-mel features of one window, ``[1, 3000, n_mels]`` in the LLM's ``encoder_input_features`` type."""

    def __init__(self, checkpoint_dir: Path | str, data_type: str) -> None:
        from transformers import WhisperFeatureExtractor

        self.extractor = WhisperFeatureExtractor.from_pretrained(str(checkpoint_dir), local_files_only=True)
        if self.extractor.sampling_rate != SAMPLE_RATE or self.extractor.nb_max_frames != WINDOW_FRAMES:
            raise ValueError(
                f"{checkpoint_dir}/preprocessor_config.json is not Whisper's 30 s at 16 kHz "
                f"({self.extractor.sampling_rate} Hz, {self.extractor.nb_max_frames} frames)"
            )
        self.dtype = FEATURE_DTYPES[data_type]
        self.n_mels = self.extractor.feature_size

    def __call__(self, window: np.ndarray) -> np.ndarray:
        found = self.extractor(window, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
        return np.ascontiguousarray(found.transpose(0, 2, 1), dtype=self.dtype)
