"""The reference's mel spectrogram that conditions the flow (``prompt_speech_feat``), and its alignment with the
reference's speech tokens.

The official front end computes it at 24 kHz with Matcha-TTS's ``mel_spectrogram``: frames of 1920 samples every
480 (50 a second, two per speech token) over the waveform reflect-padded by 720 samples each side (no centring),
a periodic Hann window, the magnitude ``sqrt(re² + im² + 1e-9)``, 80 Slaney-scaled mel filters with area
normalisation (librosa's default) from 0 Hz to ``fmax``, and the natural log of it floored at 1e-5. CosyVoice2
stops the filters at 8 kHz, CosyVoice3 at the Nyquist frequency (12 kHz).

As the official Triton deployment does, the 24 kHz waveform is the 16 kHz reference resampled (with soxr here, a
sinc resampler in the official code): nothing above 8 kHz reaches the mel, which only CosyVoice3's filters read.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .speaker import SAMPLE_RATE as REFERENCE_RATE

SAMPLE_RATE = 24000
N_FFT = 1920
HOP = 480
MEL_BINS = 80
#: Mel frames per speech token (25 tokens a second, 50 frames).
FRAMES_PER_TOKEN = 2


class PromptMel:
    """``features(wave_16k)`` → ``[frames, 80]`` float32 log-mel frames, ``frames = len(wave_24k) // 480``."""

    def __init__(self, fmax: float | None):
        self.fmax = fmax

    @cached_property
    def filters(self) -> np.ndarray:
        """``[N_FFT // 2 + 1, MEL_BINS]`` Slaney mel filters (Slaney area norm)."""
        from transformers.audio_utils import mel_filter_bank

        return mel_filter_bank(
            num_frequency_bins=N_FFT // 2 + 1,
            num_mel_filters=MEL_BINS,
            min_frequency=0.0,
            max_frequency=SAMPLE_RATE / 2 if self.fmax is None else self.fmax,
            sampling_rate=SAMPLE_RATE,
            norm="slaney",
            mel_scale="slaney",
        ).astype(np.float32)

    @cached_property
    def _bins(self) -> int:
        """The FFT bins up to the last one a filter reads (CosyVoice2's stop at 8 kHz: two thirds of them)."""
        return int(np.flatnonzero(self.filters.any(axis=1))[-1]) + 1

    @cached_property
    def _window(self) -> np.ndarray:
        return _periodic_hann(N_FFT).astype(np.float32)

    def features(self, wave: np.ndarray) -> np.ndarray:
        """The magnitudes, mel and log in float32 (upstream's torch computes in float32; NumPy's FFT itself works in
        float64), and only over the bins a filter reads (this runs on the entry's CPU before the first chunk)."""
        import soxr

        samples = soxr.resample(np.asarray(wave, dtype=np.float32), REFERENCE_RATE, SAMPLE_RATE)
        padding = (N_FFT - HOP) // 2
        if samples.size <= padding:  # too short to reflect the padding (and under 2 frames of audio)
            return np.zeros((0, MEL_BINS), dtype=np.float32)
        padded = np.pad(samples, padding, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
        spectrum = np.fft.rfft(frames * self._window, axis=-1)[:, : self._bins]
        magnitude = np.sqrt(spectrum.real**2 + spectrum.imag**2 + 1e-9).astype(np.float32)
        return np.log(np.maximum(magnitude @ self.filters[: self._bins], 1e-5))


def _periodic_hann(size: int) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(size) / size)


def align(tokens: np.ndarray, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference's tokens and mel frames cut to the same length (two frames a token), as the flow requires:
    ``min(frames // 2, tokens)`` tokens, twice as many frames (usually one token or none is cut)."""
    count = min(len(features) // FRAMES_PER_TOKEN, len(tokens))
    return tokens[:count], features[: count * FRAMES_PER_TOKEN]
