"""CosyVoice's HiFT vocoder (a neural source filter with an iSTFT head): mel frames to 24 kHz audio, 480 samples a
frame, for both generations: ``HiFTGenerator`` (CosyVoice2) and the causal ``CausalHiFTGenerator`` (CosyVoice3).

An F0 predictor reads the mel; the F0 drives a harmonic sine source (fundamental and 8 overtones, plus noise) merged
into one excitation signal, whose STFT joins the upsampling stack at every resolution. The stack (conv_pre, three
upsampling stages each with residual blocks of Snake activations, conv_post) ends in a magnitude and a phase per STFT
bin, and an inverse STFT gives the audio.

CosyVoice3's version has only causal convolutions, apart from two lookaheads: the F0 predictor's first layer reads 3
frames ahead and conv_pre 4. Called with ``finalize=False`` on a growing mel, it takes those lookahead frames from the
mel's end and returns the audio that later frames cannot change, ``(M - 8) * 480`` samples, a prefix of what the
whole mel gives. CosyVoice2's version sees both sides; its streaming caller re-vocodes an overlap and cross-fades it
(:func:`stream_vocode`).

Batches are right padded, with per-row frame counts; each row gives what it gives alone. The STFT and its inverse run
per row at the row's own length (their centre padding reflects at the row's end), non-causal convolutions read zeros
past each row's end, and the frame-to-sample phase interpolation holds each row's last frame. In float64 a row and the
row alone agree to 1e-15; in float32 they differ by convolution rounding, which depends on the batch size and which
the excitation's phase (F0 integrated over time) amplifies: up to 4e-5 measured for CosyVoice2 (F0 in float32), 2e-7
for CosyVoice3 (F0 in float64).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from trtdeploy import UsageError

#: Snake's guard against a zero alpha.
_SNAKE_EPS = 1e-9
#: The iSTFT magnitude, ``exp`` of the network's output, is clipped here.
_MAX_MAGNITUDE = 100.0
#: CosyVoice3's fixed noise table has this many rows (300 s at 24 kHz), as the official model allocates it.
NOISE_TABLE_ROWS = 300 * 24000
#: CosyVoice2 streaming: each call re-vocodes this many mel frames of the previous call (prepended to its chunk) ...
STREAM_MEL_CACHE_FRAMES = 8
#: ... keeps the previous call's excitation over those frames, and cross-fades this many samples with the previous
#: call's held-back tail (Hamming window of twice this length).
STREAM_SAMPLE_CACHE = 3840


@dataclass(frozen=True)
class F0PredictorConfig:
    """The ``f0_predictor`` arguments of the official yaml (``ConvRNNF0Predictor`` / ``CausalConvRNNF0Predictor``)."""

    #: Outputs of the classifier; F0 is one value a frame.
    num_class: int = 1
    in_channels: int = 80
    cond_channels: int = 512


@dataclass(frozen=True)
class HiFTConfig:
    """The ``hift`` arguments of the official cosyvoice2.yaml (``HiFTGenerator``), with the released model's values."""

    in_channels: int = 80
    base_channels: int = 512
    #: Overtones above the fundamental in the sine source.
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    #: Amplitude of the sines; unvoiced samples get Gaussian (v2) or uniform (v3) noise of a third of it.
    nsf_alpha: float = 0.1
    #: Noise amplitude on voiced samples.
    nsf_sigma: float = 0.003
    #: F0 (Hz) above which a frame is voiced.
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_params: Mapping[str, int] = field(default_factory=lambda: {"n_fft": 16, "hop_len": 4})
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    #: Leaky ReLU slope before each upsampling (the one before conv_post is torch's default, 0.01).
    lrelu_slope: float = 0.1
    #: The audio is clamped to this magnitude.
    audio_limit: float = 0.99
    f0_predictor: F0PredictorConfig = F0PredictorConfig()

    def __post_init__(self) -> None:
        for name in (
            "upsample_rates",
            "upsample_kernel_sizes",
            "resblock_kernel_sizes",
            "source_resblock_kernel_sizes",
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("resblock_dilation_sizes", "source_resblock_dilation_sizes"):
            object.__setattr__(self, name, tuple(tuple(dilations) for dilations in getattr(self, name)))
        if not isinstance(self.f0_predictor, F0PredictorConfig):
            object.__setattr__(self, "f0_predictor", F0PredictorConfig(**self.f0_predictor))
        object.__setattr__(self, "istft_params", MappingProxyType(dict(self.istft_params)))
        self._check()

    def _check(self) -> None:
        if set(self.istft_params) != {"n_fft", "hop_len"}:
            raise UsageError(
                f"hift istft_params has keys {sorted(self.istft_params)}", hint="give exactly n_fft and hop_len"
            )
        if self.sampling_rate == 22050:
            raise UsageError(
                "a 22050 Hz HiFT (CosyVoice1's sine source) is not supported",
                hint="use a 24000 Hz CosyVoice2/3 hift",
            )
        stages = len(self.upsample_rates)
        if (
            not stages
            == len(self.upsample_kernel_sizes)
            == len(self.source_resblock_kernel_sizes)
            == len(self.source_resblock_dilation_sizes)
        ):
            raise UsageError(
                "hift upsample_rates, upsample_kernel_sizes, source_resblock_kernel_sizes and "
                "source_resblock_dilation_sizes differ in length",
                hint="give one entry per upsampling stage in each",
            )
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise UsageError(
                "hift resblock_kernel_sizes and resblock_dilation_sizes differ in length",
                hint="give one dilation list per residual block kernel",
            )
        if self.base_channels % 2**stages:
            raise UsageError(
                f"hift base_channels {self.base_channels} does not halve {stages} times",
                hint=f"use a multiple of {2**stages}",
            )
        if self.f0_predictor.in_channels != self.in_channels or self.f0_predictor.num_class != 1:
            raise UsageError(
                f"the F0 predictor reads {self.f0_predictor.in_channels} channels into "
                f"{self.f0_predictor.num_class} classes; hift reads {self.in_channels}",
                hint="set f0_predictor in_channels to hift's in_channels and num_class to 1",
            )

    @property
    def n_fft(self) -> int:
        return self.istft_params["n_fft"]

    @property
    def hop_len(self) -> int:
        return self.istft_params["hop_len"]

    @property
    def stft_bins(self) -> int:
        return self.n_fft // 2 + 1

    @property
    def upsample_factor(self) -> int:
        """Upsampling of the convolution stack: STFT frames per mel frame (120)."""
        return math.prod(self.upsample_rates)

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per mel frame (480)."""
        return self.upsample_factor * self.hop_len


@dataclass(frozen=True)
class CausalHiFTConfig(HiFTConfig):
    """The ``hift`` arguments of the official cosyvoice3.yaml (``CausalHiFTGenerator``)."""

    #: Frames conv_pre reads ahead (its kernel is one more).
    conv_pre_look_right: int = 4

    def _check(self) -> None:
        super()._check()
        if self.nb_harmonics != 8:
            raise UsageError(
                f"the causal hift's fixed noise table has 9 columns, not nb_harmonics + 1 = {self.nb_harmonics + 1}",
                hint="set nb_harmonics to 8, as CosyVoice3",
            )


class VocoderOutput(NamedTuple):
    """Audio ``[B, S]`` (zero past each row's length), each row's sample count ``[B]``, and the excitation
    ``[B, 1, L]`` the audio was made from (valid over each row's F0 frames x 480 samples)."""

    speech: torch.Tensor
    lengths: torch.Tensor
    source: torch.Tensor


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask


def _length_mask(lengths: torch.Tensor, size: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 1, size]``: 1 before each row's length, 0 from it on."""
    return (torch.arange(size, device=lengths.device) < lengths[:, None]).to(dtype).unsqueeze(1)


def _weight_in(conv: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The conv's weight in ``dtype``; under weight norm, the norm itself computed in ``dtype`` (upstream converts its
    causal F0 predictor to float64 before it runs, norm included)."""
    if parametrize.is_parametrized(conv, "weight"):
        weight = conv.parametrizations.weight
        return weight[0](weight.original0.to(dtype), weight.original1.to(dtype))
    return conv.weight.to(dtype)


def _promoted(dtype: torch.dtype) -> torch.dtype:
    """At least float32: the source phase and the STFT are not computed in half precision (upstream's float32
    harmonic numbers and window force it there too)."""
    return torch.promote_types(dtype, torch.float32)


class CausalConv1d(nn.Conv1d):
    """A stride-1 Conv1d padded with zeros on one side only: the left (causal), or the right (``lookahead``: each
    output reads its own frame and ``(kernel - 1) * dilation`` later ones)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, lookahead: bool = False
    ):
        super().__init__(in_channels, out_channels, kernel_size, dilation=dilation)
        self.lookahead = lookahead
        self.causal_padding = (kernel_size - 1) * dilation

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, self.causal_padding) if self.lookahead else (self.causal_padding, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.pad(x))


class CausalUpsample(nn.Conv1d):
    """Upsampling by ``rate``: each frame repeated ``rate`` times, then a causal conv (weight ``[out, in, k]``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, rate: int):
        super().__init__(in_channels, out_channels, kernel_size)
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x.repeat_interleave(self.rate, dim=-1), (self.kernel_size[0] - 1, 0)))


class CausalDownsample(nn.Conv1d):
    """Downsampling by ``rate`` with a ``2 * rate`` kernel, left padded by ``rate - 1``."""

    def __init__(self, in_channels: int, out_channels: int, rate: int):
        super().__init__(in_channels, out_channels, 2 * rate, stride=rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.stride[0] - 1, 0)))


class Snake(nn.Module):
    """``x + sin(alpha x)^2 / alpha`` with a learned alpha per channel (linear scale, initialised to 1)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + _SNAKE_EPS)) * torch.sin(x * alpha).pow(2)


def _stack_conv(channels: int, kernel_size: int, dilation: int, causal: bool) -> nn.Conv1d:
    if causal:
        return CausalConv1d(channels, channels, kernel_size, dilation)
    return nn.Conv1d(channels, channels, kernel_size, dilation=dilation, padding=(kernel_size - 1) * dilation // 2)


class ResBlock(nn.Module):
    """Per dilation: Snake, dilated conv, Snake, conv, added to the input. ``mask`` zeroes each conv's input past
    the row's end (non-causal convolutions read there)."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int], causal: bool):
        super().__init__()
        self.convs1 = nn.ModuleList(weight_norm(_stack_conv(channels, kernel_size, d, causal)) for d in dilations)
        self.convs2 = nn.ModuleList(weight_norm(_stack_conv(channels, kernel_size, 1, causal)) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for conv1, conv2, snake1, snake2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = x + conv2(_masked(snake2(conv1(_masked(snake1(x), mask))), mask))
        return x


class F0Predictor(nn.Module):
    """Mel ``[B, in, M]`` to F0 ``[B, M]`` (Hz): five weight-normed k3 convs with ELU, a linear classifier, ``abs``.

    Causal: the first conv has kernel 4 and reads 3 frames ahead, the others are causal. The computation runs in the
    input's dtype whatever the parameters' (CosyVoice3 runs it in float64).
    """

    LAYERS = 5

    def __init__(self, config: F0PredictorConfig, causal: bool):
        super().__init__()
        layers: list[nn.Module] = []
        for index in range(self.LAYERS):
            in_channels = config.in_channels if index == 0 else config.cond_channels
            if not causal:
                conv = nn.Conv1d(in_channels, config.cond_channels, 3, padding=1)
            elif index == 0:
                conv = CausalConv1d(in_channels, config.cond_channels, 4, lookahead=True)
            else:
                conv = CausalConv1d(in_channels, config.cond_channels, 3)
            layers += [weight_norm(conv), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(config.cond_channels, config.num_class)

    @property
    def lookahead(self) -> int:
        """Frames the predictor reads past the last frame it predicts (0 for the non-causal one: it pads)."""
        first = self.condnet[0]
        return first.causal_padding if isinstance(first, CausalConv1d) else 0

    def forward(self, mel: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x, dtype = mel, mel.dtype
        for conv in self.condnet[::2]:  # each conv, then its ELU (as a function: the dtype is the input's)
            x = _masked(x, mask)
            if isinstance(conv, CausalConv1d):
                x = conv.pad(x)
            x = F.elu(F.conv1d(x, _weight_in(conv, dtype), conv.bias.to(dtype), padding=conv.padding))
        f0 = F.linear(x.transpose(1, 2), self.classifier.weight.to(dtype), self.classifier.bias.to(dtype))
        return f0.squeeze(-1).abs()


class HarmonicSource(nn.Module):
    """The excitation: F0 ``[B, M]`` to ``[B, 1, M * 480]``.

    For each of the fundamental and its overtones, the phase advance per sample ``h * f0 / rate`` (mod 1) is summed
    over frames (at frame rate), scaled to samples and interpolated to sample rate: linearly for CosyVoice2, by
    repetition for CosyVoice3 (causal). Sines of amplitude ``nsf_alpha`` on voiced samples (F0 above the threshold),
    plus the caller's noise scaled by ``nsf_sigma`` (voiced) or ``nsf_alpha / 3`` (unvoiced); a linear layer and tanh
    merge the harmonics. Upstream computes the advance at sample rate and resamples it to frame rate linearly, which
    reads two equal samples in each frame's middle: the frame's own value, bit for bit, as computed here.
    """

    def __init__(self, config: HiFTConfig, causal: bool):
        super().__init__()
        self.l_linear = nn.Linear(config.nb_harmonics + 1, 1)
        self.harmonics = config.nb_harmonics + 1
        self.sampling_rate = config.sampling_rate
        self.sine_amplitude = config.nsf_alpha
        self.voiced_noise = config.nsf_sigma
        self.voiced_threshold = config.nsf_voiced_threshold
        self.samples_per_frame = config.samples_per_frame
        self.causal = causal

    def forward(self, f0: torch.Tensor, noise: torch.Tensor, frame_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``noise`` broadcasts to ``[B, M * 480, harmonics]``; ``frame_lengths`` (linear interpolation only) holds
        each row's last phase past its end, as interpolating a row alone would."""
        dtype = _promoted(f0.dtype)
        f0 = f0.to(dtype)
        numbers = torch.arange(1, self.harmonics + 1, device=f0.device, dtype=dtype)
        advance = (f0.unsqueeze(-1) * numbers / self.sampling_rate) % 1
        phase = torch.cumsum(advance, dim=1) * 2 * math.pi * self.samples_per_frame
        if frame_lengths is not None and not self.causal:
            last = phase.gather(1, (frame_lengths - 1).clamp(min=0)[:, None, None].expand(-1, 1, self.harmonics))
            frames = torch.arange(phase.shape[1], device=f0.device)[None, :, None]
            phase = torch.where(frames < frame_lengths[:, None, None], phase, last)
        # Upsampled along the last axis and seen transposed, as upstream: the memory layout decides the merging
        # layer's summation order, so this keeps its output bit for bit.
        phase = phase.transpose(1, 2)
        if self.causal:
            phase = phase.repeat_interleave(self.samples_per_frame, dim=-1)
        else:
            phase = F.interpolate(phase, scale_factor=self.samples_per_frame, mode="linear")
        phase = phase.transpose(1, 2)
        sines = torch.sin(phase) * self.sine_amplitude
        voiced = (f0 > self.voiced_threshold).to(dtype).repeat_interleave(self.samples_per_frame, dim=1).unsqueeze(-1)
        noise_amplitude = voiced * self.voiced_noise + (1 - voiced) * self.sine_amplitude / 3
        waves = sines * voiced + noise_amplitude * noise.to(dtype)
        merged = torch.tanh(self.l_linear(waves.to(self.l_linear.weight.dtype)))
        return merged.transpose(1, 2)


def _hann_window(n_fft: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The periodic Hann window, computed in float64 and rounded once (as upstream's scipy window)."""
    return torch.hann_window(n_fft, periodic=True, dtype=torch.float64, device=device).to(dtype)


def _source_spectrum(
    source: torch.Tensor, sample_lengths: torch.Tensor, keep_frames: torch.Tensor, frames: int, n_fft: int, hop: int
) -> torch.Tensor:
    """Centred STFT of each row's excitation at its own length, ``[real bins | imaginary bins]`` ``[B, 2F, frames]``,
    the first ``keep_frames`` of each row kept and the rest zero."""
    dtype = _promoted(source.dtype)
    window = _hann_window(n_fft, dtype, source.device)
    spectrum = source.new_zeros(source.shape[0], 2 * (n_fft // 2 + 1), frames, dtype=dtype)
    for row, (length, keep) in enumerate(zip(sample_lengths.tolist(), keep_frames.tolist(), strict=True)):
        stft = torch.stft(source[row, 0, :length].to(dtype), n_fft, hop, n_fft, window=window, return_complex=True)
        spectrum[row, :, :keep] = torch.view_as_real(stft[:, :keep]).permute(2, 0, 1).flatten(0, 1)
    return spectrum


def _inverse_spectrum(head: torch.Tensor, frame_counts: torch.Tensor, n_fft: int, hop: int) -> torch.Tensor:
    """conv_post's output ``[B, 2F, T]`` (log magnitudes | phases through ``sin``) to audio ``[B, hop * (T - 1)]``,
    each row's inverse STFT over its own frames, zero past them."""
    dtype = _promoted(head.dtype)
    head = head.to(dtype)
    bins = n_fft // 2 + 1
    magnitude = torch.exp(head[:, :bins]).clip(max=_MAX_MAGNITUDE)
    phase = torch.sin(head[:, bins:])
    spectrum = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    window = _hann_window(n_fft, dtype, head.device)
    audio = head.new_zeros(head.shape[0], hop * (head.shape[-1] - 1))
    for row, count in enumerate(frame_counts.tolist()):
        audio[row, : hop * (count - 1)] = torch.istft(spectrum[row, :, :count], n_fft, hop, n_fft, window=window)
    return audio


class _SourceFilterVocoder(nn.Module):
    """What both generations share: the modules' names and order (the checkpoint's keys) and the decoder stack."""

    def __init__(self, config: HiFTConfig, causal: bool):
        super().__init__()
        self.config = config
        channels = [config.base_channels // 2**stage for stage in range(len(config.upsample_rates) + 1)]
        spectrum_channels = 2 * config.stft_bins
        self.m_source = HarmonicSource(config, causal)
        if causal:
            look_right = config.conv_pre_look_right
            conv_pre = CausalConv1d(config.in_channels, channels[0], look_right + 1, lookahead=True)
        else:
            conv_pre = nn.Conv1d(config.in_channels, channels[0], 7, padding=3)
        self.conv_pre = weight_norm(conv_pre)
        ups = []
        for stage, (rate, kernel) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)):
            if causal:
                up = CausalUpsample(channels[stage], channels[stage + 1], kernel, rate)
            else:
                up = nn.ConvTranspose1d(
                    channels[stage], channels[stage + 1], kernel, rate, padding=(kernel - rate) // 2
                )
            ups.append(weight_norm(up))
        self.ups = nn.ModuleList(ups)
        # The excitation's spectrum enters stage i at that stage's resolution: downsampled by the later stages' rates.
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for stage, (kernel, dilations) in enumerate(
            zip(config.source_resblock_kernel_sizes, config.source_resblock_dilation_sizes, strict=True)
        ):
            rate = math.prod(config.upsample_rates[stage + 1 :])
            out = channels[stage + 1]
            if rate == 1:
                down = CausalConv1d(spectrum_channels, out, 1) if causal else nn.Conv1d(spectrum_channels, out, 1)
            elif causal:
                down = CausalDownsample(spectrum_channels, out, rate)
            else:
                down = nn.Conv1d(spectrum_channels, out, 2 * rate, rate, padding=rate // 2)
            self.source_downs.append(down)
            self.source_resblocks.append(ResBlock(out, kernel, dilations, causal))
        self.resblocks = nn.ModuleList(
            ResBlock(channels[stage + 1], kernel, dilations, causal)
            for stage in range(len(config.upsample_rates))
            for kernel, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True)
        )
        if causal:
            conv_post = CausalConv1d(channels[-1], spectrum_channels, 7)
        else:
            conv_post = nn.Conv1d(channels[-1], spectrum_channels, 7, padding=3)
        self.conv_post = weight_norm(conv_post)
        self.f0_predictor = F0Predictor(config.f0_predictor, causal)

    def fold_weight_norm(self) -> None:
        """Bake each weight norm into a plain weight (for inference): the same function, one tensor a conv, and the
        keys become ``X.weight``; load the checkpoint first."""
        for module in self.modules():
            if parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight")

    def _decode(
        self,
        x: torch.Tensor,
        source_spectrum: torch.Tensor,
        frame_mask: torch.Tensor | None = None,
        stage_masks: Sequence[torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """Mel ``[B, in, M]`` and the excitation's spectrum to conv_post's output ``[B, 2F, upsample_factor * M + 1]``.
        The masks (CosyVoice2) zero the non-causal convolutions' input past each row's end, at mel resolution and at
        each stage's output resolution."""
        stages = len(self.ups)
        stage_masks = stage_masks or [None] * stages
        source_spectrum = source_spectrum.to(x.dtype)
        per_stage = len(self.config.resblock_kernel_sizes)
        x = self.conv_pre(x)
        for stage, up in enumerate(self.ups):
            x = up(
                _masked(F.leaky_relu(x, self.config.lrelu_slope), frame_mask if stage == 0 else stage_masks[stage - 1])
            )
            if stage == stages - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            mask = stage_masks[stage]
            x = x + self.source_resblocks[stage](self.source_downs[stage](source_spectrum), mask)
            blocks = self.resblocks[stage * per_stage : (stage + 1) * per_stage]
            total = blocks[0](x, mask)
            for block in blocks[1:]:
                total = total + block(x, mask)
            x = total / per_stage
        return self.conv_post(_masked(F.leaky_relu(x), stage_masks[-1]))

    def _speech(self, head: torch.Tensor, frame_counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        audio = _inverse_spectrum(head, frame_counts, self.config.n_fft, self.config.hop_len)
        return audio.clamp(-self.config.audio_limit, self.config.audio_limit).to(dtype)


def _frame_lengths(mel: torch.Tensor, mel_lengths: torch.Tensor | None) -> torch.Tensor:
    batch, frames = mel.shape[0], mel.shape[-1]
    if mel_lengths is None:
        return torch.full((batch,), frames, dtype=torch.long, device=mel.device)
    lengths = mel_lengths.to(device=mel.device, dtype=torch.long)
    if lengths.shape != (batch,) or int(lengths.min()) < 1 or int(lengths.max()) > frames:
        raise UsageError(
            f"mel_lengths {lengths.tolist()} do not fit a mel of {batch} rows x {frames} frames",
            hint="give one length a row, each between 1 and the mel's frame count",
        )
    return lengths


def gaussian_source_noise(
    batch: int,
    samples: int,
    harmonics: int = 9,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """CosyVoice2's source noise, standard normal ``[batch, samples, harmonics]`` float32, from ``generator`` (on
    ``device``) or torch's global RNG.

    It is drawn as upstream draws it, into a harmonic-major tensor seen transposed (torch fills such a view element by
    element, so the layout decides the values), and upstream draws ``torch.rand(batch, harmonics)`` (an initial
    phase without effect) just before it: draw that first, and a seeded RNG gives upstream's noise.
    """
    noise = torch.empty(batch, harmonics, samples, device=device).transpose(1, 2)
    return noise.normal_(generator=generator)


class HiFTGenerator(_SourceFilterVocoder):
    """CosyVoice2's vocoder (non-causal convolutions, linear phase interpolation, fresh Gaussian noise)."""

    def __init__(self, config: HiFTConfig | None = None):
        config = config or HiFTConfig()
        for kernel, rate in zip(config.upsample_kernel_sizes, config.upsample_rates, strict=True):
            if (kernel - rate) % 2:
                raise UsageError(
                    f"hift upsampling kernel {kernel} with rate {rate} does not upsample exactly",
                    hint="use kernel sizes of the rate's parity (16/8, 11/5, 7/3)",
                )
        super().__init__(config, causal=False)

    def forward(
        self,
        mel: torch.Tensor,
        mel_lengths: torch.Tensor | None = None,
        *,
        cache_source: torch.Tensor | None = None,
        cache_source_lengths: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> VocoderOutput:
        """Audio for mel ``[B, in, M]`` (``M * 480`` samples a row).

        ``cache_source`` ``[B, 1, C]`` replaces the start of each row's excitation (the first
        ``cache_source_lengths[b]`` samples, all C by default; 0 leaves a row alone): a streaming call passes the
        previous call's excitation over the mel frames it re-vocodes. The noise is ``noise`` ``[B or 1, >= M * 480,
        9]`` when given (reproducible), else drawn from ``generator`` or, by default, from torch's global RNG, fresh
        every call, as upstream.
        """
        config = self.config
        lengths = _frame_lengths(mel, mel_lengths)
        batch, frames = mel.shape[0], mel.shape[-1]
        padded = bool((lengths < frames).any())  # without padding, no masks are needed
        mask = _length_mask(lengths, frames, mel.dtype) if padded else None
        samples, sample_lengths = frames * config.samples_per_frame, lengths * config.samples_per_frame
        harmonics = config.nb_harmonics + 1
        f0 = self.f0_predictor(mel, mask)
        if noise is None:
            noise = gaussian_source_noise(batch, samples, harmonics, generator=generator, device=mel.device)
        elif (
            noise.ndim != 3
            or noise.shape[0] not in (1, batch)
            or noise.shape[1] < samples
            or noise.shape[2] != harmonics
        ):
            raise UsageError(
                f"source noise {tuple(noise.shape)} does not cover {batch} rows x {samples} samples x {harmonics}",
                hint=f"give noise [B, M * {config.samples_per_frame}, {harmonics}]",
            )
        source = self.m_source(f0, noise[:, :samples], lengths if padded else None)
        if cache_source is not None:
            source = _replace_start(source, cache_source, cache_source_lengths, sample_lengths)
        stage_lengths, stage_masks = [], []
        for stage in range(len(self.ups)):
            factor = math.prod(config.upsample_rates[: stage + 1])
            extra = 1 if stage == len(self.ups) - 1 else 0  # the reflection pad before the last stage's fusion
            stage_lengths.append(lengths * factor + extra)
            stage_masks.append(_length_mask(stage_lengths[-1], frames * factor + extra, mel.dtype) if padded else None)
        spectrum = _source_spectrum(
            source, sample_lengths, stage_lengths[-1], frames * config.upsample_factor + 1, config.n_fft, config.hop_len
        )
        head = self._decode(_masked(mel, mask), spectrum, mask, stage_masks)
        return VocoderOutput(self._speech(head, stage_lengths[-1], mel.dtype), sample_lengths, source)


def _replace_start(
    source: torch.Tensor, cache: torch.Tensor, cache_lengths: torch.Tensor | None, sample_lengths: torch.Tensor
) -> torch.Tensor:
    """``source`` ``[B, 1, L]``, each row's first ``cache_lengths[b]`` samples taken from ``cache`` ``[B, 1, C]``."""
    batch, width = source.shape[0], cache.shape[-1]
    counts = (
        torch.full((batch,), width, device=source.device)
        if cache_lengths is None
        else cache_lengths.to(device=source.device, dtype=torch.long)
    )
    if cache.ndim != 3 or cache.shape[:2] != (batch, 1) or counts.shape != (batch,):
        raise UsageError(
            f"cache_source {tuple(cache.shape)} does not match {batch} rows", hint="give cache_source [B, 1, samples]"
        )
    if bool((counts > width).any()) or bool((counts > sample_lengths).any()):
        raise UsageError(
            f"cache_source_lengths {counts.tolist()} exceed the cache ({width}) or the rows' audio "
            f"({sample_lengths.tolist()} samples)",
            hint="cache at most a row's audio length, as much as the cache holds",
        )
    width = min(width, source.shape[-1])
    positions = torch.arange(width, device=source.device)
    start = torch.where(positions < counts[:, None, None], cache[..., :width].to(source.dtype), source[..., :width])
    return torch.cat([start, source[..., width:]], dim=-1)


#: What the official CosyVoice3 model draws from torch's global RNG between its flow's CFM reseeding it to 0 and
#: drawing the HiFT noise table, as (distribution, count), in order: the CFM's fixed noise [1, 80, 15000], the flow's
#: token embedding (6561 x 80) and speaker projection (192 -> 80: weight, bias), the F0 predictor's five convs (80 ->
#: 512 k4, then 512 -> 512 k3: weight, bias) and classifier (512 -> 1), and the sine source's initial phases (9).
_DRAWS_BEFORE_NOISE_TABLE: tuple[tuple[str, int], ...] = (
    ("normal", 80 * 15000),
    ("normal", 6561 * 80),
    ("uniform", 80 * 192),
    ("uniform", 80),
    ("uniform", 512 * 80 * 4),
    ("uniform", 512),
    *((("uniform", 512 * 512 * 3), ("uniform", 512)) * 4),
    ("uniform", 512),
    ("uniform", 1),
    ("uniform", 9),
)
#: The table grows by at least this many rows (10 s) at a time.
_NOISE_TABLE_GROWTH = 10 * 24000


class FixedNoiseTable:
    """CosyVoice3's source noise: a fixed table of uniform [0, 1) values ``[rows, 9]``, row ``i`` for sample ``i``.

    Upstream draws the whole table (300 s) from the global RNG while it builds the model, right after the flow's CFM
    reseeds it to 0, so it is the same in every process. Here a private CPU generator replays the draws before it
    (:data:`_DRAWS_BEFORE_NOISE_TABLE`, the released model's sizes whatever this model's) and then draws rows only as
    far as a call needs, growing the table later: CPU uniform draws are sequential, so rows drawn in pieces equal the
    rows of one big draw. The global RNG is never touched.
    """

    def __init__(self) -> None:
        self._generator: torch.Generator | None = None
        self._rows = torch.empty(0, 9)

    def rows(self, count: int, device: torch.device | str) -> torch.Tensor:
        """The table's first ``count`` rows, float32 on ``device`` (the table stays there for the next call)."""
        if count > NOISE_TABLE_ROWS:
            raise UsageError(
                f"CosyVoice3's fixed source noise covers {NOISE_TABLE_ROWS} samples (300 s), not {count}",
                hint="vocode at most 300 s of audio at once",
            )
        have = self._rows.shape[0]
        if have < count:
            if self._generator is None:
                self._generator = torch.Generator().manual_seed(0)
                for distribution, size in _DRAWS_BEFORE_NOISE_TABLE:
                    getattr(torch.empty(size), f"{distribution}_")(generator=self._generator)
            wanted = min(NOISE_TABLE_ROWS, max(count, 2 * have, _NOISE_TABLE_GROWTH))
            more = torch.rand(wanted - have, 9, generator=self._generator)
            self._rows = torch.cat([self._rows, more.to(self._rows.device)])
        self._rows = self._rows.to(device)
        return self._rows[:count]


class CausalHiFTGenerator(_SourceFilterVocoder):
    """CosyVoice3's vocoder: causal convolutions with lookaheads, repeated frame phases, fixed uniform noise, and the
    F0 predictor run in float64 (as upstream: its precision matters to the causal output)."""

    def __init__(self, config: CausalHiFTConfig | None = None):
        super().__init__(config or CausalHiFTConfig(), causal=True)
        self.noise_table = FixedNoiseTable()

    def forward(
        self, mel: torch.Tensor, mel_lengths: torch.Tensor | None = None, *, finalize: bool | torch.Tensor = True
    ) -> VocoderOutput:
        """Audio for mel ``[B, in, M]``: ``M * 480`` samples a row, or, where ``finalize`` (a bool, or one a row) is
        False, ``(M - 8) * 480``: the row's last 3 frames serve only as the F0 predictor's lookahead and the 4 before
        them as conv_pre's, and the last frame's audio, which the next frames would still change, is left out."""
        config = self.config
        lengths = _frame_lengths(mel, mel_lengths)
        batch, frames = mel.shape[0], mel.shape[-1]
        streaming = ~torch.as_tensor(finalize, dtype=torch.bool, device=mel.device).expand(batch)
        f0_frames = lengths - streaming * self.f0_predictor.lookahead
        decode_frames = f0_frames - streaming * config.conv_pre_look_right
        if int(decode_frames.min()) < 1:
            least = self.f0_predictor.lookahead + config.conv_pre_look_right + 1
            raise UsageError(
                f"mel rows of {lengths.tolist()} frames are too short for finalize={finalize}",
                hint=f"a row that is not finalized needs at least {least} frames",
            )
        f0 = self.f0_predictor(mel.double(), _length_mask(lengths, frames, torch.float64)).to(mel.dtype)
        source_frames = int(f0_frames.max())
        noise = self.noise_table.rows(source_frames * config.samples_per_frame, mel.device)
        source = self.m_source(f0[:, :source_frames], noise)
        spectrum_frames = decode_frames * config.upsample_factor + 1
        spectrum = _source_spectrum(
            source,
            f0_frames * config.samples_per_frame,
            spectrum_frames,
            source_frames * config.upsample_factor + 1,
            config.n_fft,
            config.hop_len,
        )
        mel = mel[:, :, :source_frames] * _length_mask(f0_frames, source_frames, mel.dtype)
        speech = self._speech(self._decode(mel, spectrum), spectrum_frames, mel.dtype)
        speech_lengths = (decode_frames - streaming.long()) * config.samples_per_frame
        kept = int(speech_lengths.max())
        speech = speech[:, :kept] * _length_mask(speech_lengths, kept, speech.dtype)[:, 0]
        return VocoderOutput(speech, speech_lengths, source)


@dataclass(frozen=True)
class StreamCache:
    """What a CosyVoice2 streaming request keeps from one vocoder call to the next."""

    #: The last mel frames vocoded, ``[80, 8]``: re-vocoded in front of the next chunk.
    mel: torch.Tensor
    #: The excitation over those frames, ``[3840]``: the next call's excitation starts with it.
    source: torch.Tensor
    #: The audio over those frames, ``[3840]``: held back, and cross-faded into the next call's start.
    speech: torch.Tensor

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(mel, source, speech)`` as float32 numpy arrays on the CPU (a server passes them in tensors)."""
        return tuple(part.detach().float().cpu().numpy() for part in (self.mel, self.source, self.speech))

    @classmethod
    def from_arrays(cls, mel: np.ndarray, source: np.ndarray, speech: np.ndarray) -> StreamCache:
        """The cache :meth:`to_arrays` gave (CPU float32 tensors); ValueError for arrays of other shapes."""
        shapes = tuple(np.shape(part) for part in (mel, source, speech))
        samples = ((STREAM_SAMPLE_CACHE,),) * 2
        if len(shapes[0]) != 2 or shapes[0][1] != STREAM_MEL_CACHE_FRAMES or shapes[1:] != samples:
            raise ValueError(
                f"a stream cache of shapes {list(shapes)} is not [[mel bins, {STREAM_MEL_CACHE_FRAMES}], "
                f"[{STREAM_SAMPLE_CACHE}], [{STREAM_SAMPLE_CACHE}]]: send back the cache the previous call answered"
            )
        return cls(*(torch.from_numpy(np.array(part, dtype=np.float32)) for part in (mel, source, speech)))


def crossfade(speech: torch.Tensor, held_back: torch.Tensor) -> torch.Tensor:
    """``speech`` ``[S]`` with its first ``len(held_back)`` samples faded in over ``held_back``: the rising half of
    a Hamming window on the new audio plus the falling half on the old, in float64 (as upstream's numpy window), then
    rounded back to ``speech``'s dtype."""
    overlap = held_back.shape[-1]
    window = torch.hamming_window(2 * overlap, periodic=False, dtype=torch.float64, device=speech.device)
    faded = speech[:overlap].double() * window[:overlap] + held_back.double() * window[overlap:]
    return torch.cat([faded.to(speech.dtype), speech[overlap:]])


def stream_vocode(
    vocoder: HiFTGenerator,
    mels: Sequence[torch.Tensor],
    caches: Sequence[StreamCache | None],
    finalize: Sequence[bool],
    *,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> list[tuple[torch.Tensor, StreamCache | None]]:
    """One CosyVoice2 streaming vocoder call for a batch of requests, as the official model makes it per request.

    Each request brings its new mel chunk ``[80, M]`` and the cache its previous call left (None on its first). The
    cached mel frames are prepended and vocoded again with the cached excitation, and the audio's first 3840 samples
    are cross-faded with the held-back audio. A call that is not final holds back its last 3840 samples in the new
    cache; a final one emits everything (new cache None). Joined, a request's emitted audio has ``480`` samples per
    mel frame of its chunks. Returns each request's emitted audio ``[S]`` and new cache; ``noise`` and ``generator``
    are passed to the vocoder.
    """
    inputs = [
        mel if cache is None else torch.cat([cache.mel.to(mel), mel], dim=-1)
        for mel, cache in zip(mels, caches, strict=True)
    ]
    for mel, final in zip(inputs, finalize, strict=True):
        if not final and mel.shape[-1] < STREAM_MEL_CACHE_FRAMES:
            raise UsageError(
                f"a streaming chunk of {mel.shape[-1]} mel frames is too short to continue from",
                hint=f"send at least {STREAM_MEL_CACHE_FRAMES} frames before the final chunk",
            )
    lengths = torch.tensor([mel.shape[-1] for mel in inputs], device=inputs[0].device)
    batch_mel = nn.utils.rnn.pad_sequence([mel.T for mel in inputs], batch_first=True).transpose(1, 2)
    cache_source = cache_lengths = None
    if any(cache is not None for cache in caches):
        empty = inputs[0].new_zeros(STREAM_SAMPLE_CACHE)
        cache_source = torch.stack([empty if cache is None else cache.source.to(empty) for cache in caches])[:, None]
        cache_lengths = torch.tensor([0 if cache is None else STREAM_SAMPLE_CACHE for cache in caches])
    out = vocoder(
        batch_mel,
        lengths,
        cache_source=cache_source,
        cache_source_lengths=cache_lengths,
        noise=noise,
        generator=generator,
    )
    results: list[tuple[torch.Tensor, StreamCache | None]] = []
    for row, (mel, cache, final) in enumerate(zip(inputs, caches, finalize, strict=True)):
        length = int(out.lengths[row])
        speech = out.speech[row, :length]
        if cache is not None:
            speech = crossfade(speech, cache.speech)
        if final:
            results.append((speech, None))
            continue
        held = StreamCache(
            mel=mel[:, -STREAM_MEL_CACHE_FRAMES:],
            source=out.source[row, 0, length - STREAM_SAMPLE_CACHE : length],
            speech=speech[-STREAM_SAMPLE_CACHE:],
        )
        results.append((speech[:-STREAM_SAMPLE_CACHE], held))
    return results
