"""The magnitude mel spectrogram BiCodec's speaker encoder reads.

The official model uses torchaudio's ``MelSpectrogram`` (periodic Hann window, centered frames with reflect padding,
power 1, Slaney mel scale and area norm). This module computes the same thing with ``torch.stft`` and its own
filterbank, in float32 and in the same order of operations, so the numbers match torchaudio's bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import MelConfig

# The Slaney mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor of 6.4).
_LINEAR_HZ_PER_MEL = 200.0 / 3
_LOG_REGION_START_HZ = 1000.0
_LOG_REGION_START_MEL = _LOG_REGION_START_HZ / _LINEAR_HZ_PER_MEL
_LOG_MELS_STEP = math.log(6.4) / 27.0


def hz_to_slaney_mel(frequency: float) -> float:
    if frequency < _LOG_REGION_START_HZ:
        return frequency / _LINEAR_HZ_PER_MEL
    return _LOG_REGION_START_MEL + math.log(frequency / _LOG_REGION_START_HZ) / _LOG_MELS_STEP


def slaney_mel_to_hz(mels: torch.Tensor) -> torch.Tensor:
    logarithmic = _LOG_REGION_START_HZ * torch.exp(_LOG_MELS_STEP * (mels - _LOG_REGION_START_MEL))
    return torch.where(mels >= _LOG_REGION_START_MEL, logarithmic, _LINEAR_HZ_PER_MEL * mels)


def slaney_mel_filterbank(
    *, sample_rate: int, n_fft: int, num_mels: int, fmin: float, fmax: float | None
) -> torch.Tensor:
    """Triangular filters, evenly spaced in Slaney mels and scaled to equal area: ``[n_fft // 2 + 1, num_mels]``."""
    fmax = float(sample_rate // 2) if fmax is None else fmax
    bin_frequencies = torch.linspace(0, sample_rate // 2, n_fft // 2 + 1)
    # num_mels triangles need num_mels + 2 corner frequencies: each triangle spans corners i, i + 1, i + 2.
    corners = slaney_mel_to_hz(torch.linspace(hz_to_slaney_mel(fmin), hz_to_slaney_mel(fmax), num_mels + 2))
    corner_gaps = corners[1:] - corners[:-1]
    offsets = corners.unsqueeze(0) - bin_frequencies.unsqueeze(1)
    rising = -offsets[:, :-2] / corner_gaps[:-1]
    falling = offsets[:, 2:] / corner_gaps[1:]
    triangles = torch.minimum(rising, falling).clamp_min(0.0)
    return triangles * (2.0 / (corners[2:] - corners[:-2])).unsqueeze(0)


class MelSpectrogram(nn.Module):
    """``[B, S]`` float waveforms to ``[B, num_mels, 1 + S // hop_length]`` magnitude mel spectrograms (float32)."""

    def __init__(self, config: MelConfig):
        super().__init__()
        self.n_fft = config.n_fft
        self.hop_length = config.hop_length
        self.win_length = config.win_length
        # Derived from the config, so not part of the state dict (the official checkpoint does not store them).
        self.register_buffer("window", torch.hann_window(config.win_length), persistent=False)
        filterbank = slaney_mel_filterbank(
            sample_rate=config.sample_rate,
            n_fft=config.n_fft,
            num_mels=config.num_mels,
            fmin=config.mel_fmin,
            fmax=config.mel_fmax,
        )
        self.register_buffer("filterbank", filterbank, persistent=False)

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        spectrum = torch.stft(
            waveforms.float(),
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            win_length=self.win_length,
            window=self.window.float(),
            center=True,
            pad_mode="reflect",
            return_complex=True,
        ).abs()
        return torch.matmul(spectrum.transpose(1, 2), self.filterbank.float()).transpose(1, 2)
