"""The frame-level networks of BiCodec: the feature encoder, the prenet/postnet and the waveform generator.

Module and parameter names follow the official checkpoint's state dict, so it loads as is. Tensors are channel-first
(``[B, C, T]``) between modules unless a docstring says otherwise.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from .config import (
    CONVNEXT_KERNEL,
    GENERATOR_OUTER_KERNEL,
    RESAMPLE_STAGE_LAYERS,
    RESIDUAL_UNIT_DILATIONS,
    RESIDUAL_UNIT_KERNEL,
    FeatureDecoderConfig,
    FeatureEncoderConfig,
    WaveGeneratorConfig,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only builds of torch come without Triton
    triton = None

_NORM_EPS = 1e-6
#: Under Triton's interpreter (how the tests check the fused kernel without a GPU) it runs on CPU tensors too.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


class WeightNormConv1d(nn.Conv1d):
    """A convolution the official model weight-normalizes. The checkpoint stores it as ``weight_g``/``weight_v``;
    loading folds them into ``weight``, so it runs as a plain convolution."""


class WeightNormConvTranspose1d(nn.ConvTranspose1d):
    """The transposed counterpart of :class:`WeightNormConv1d` (normalized per input channel, dim 0)."""


def zero_padding_frames(x: torch.Tensor, frame_mask: torch.Tensor | None) -> torch.Tensor:
    """Zeroes the frames past each sequence's end (``frame_mask`` ``[B, T]``, true on valid frames), so that a
    convolution sees the zero padding it would see at the end of that sequence alone."""
    if frame_mask is None:
        return x
    return x.masked_fill(~frame_mask.unsqueeze(1), 0.0)


class AdaLayerNorm(nn.Module):
    """Layer norm without its own affine, scaled and shifted by linear maps of a per-sequence condition vector."""

    def __init__(self, condition_dim: int, dim: int):
        super().__init__()
        self.dim = dim
        self.scale = nn.Linear(condition_dim, dim)
        self.shift = nn.Linear(condition_dim, dim)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        """``x`` is channel-last ``[B, T, C]``; ``condition`` is ``[B, condition_dim]``."""
        normalized = F.layer_norm(x, (self.dim,), eps=_NORM_EPS)
        return normalized * self.scale(condition).unsqueeze(1) + self.shift(condition).unsqueeze(1)


def _channel_last_norm(dim: int, condition_dim: int | None) -> nn.Module:
    return AdaLayerNorm(condition_dim, dim) if condition_dim else nn.LayerNorm(dim, eps=_NORM_EPS)


def _apply_norm(norm: nn.Module, x: torch.Tensor, condition: torch.Tensor | None) -> torch.Tensor:
    return norm(x, condition) if isinstance(norm, AdaLayerNorm) else norm(x)


class ConvNeXtBlock(nn.Module):
    """Depthwise conv, (adaptive) layer norm, GELU MLP, per-channel layer scale, residual."""

    def __init__(self, dim: int, intermediate_dim: int, condition_dim: int | None):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, CONVNEXT_KERNEL, padding=CONVNEXT_KERNEL // 2, groups=dim)
        self.norm = _channel_last_norm(dim, condition_dim)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, condition: torch.Tensor | None, frame_mask: torch.Tensor | None) -> torch.Tensor:
        hidden = self.dwconv(zero_padding_frames(x, frame_mask)).transpose(1, 2)
        hidden = self.pwconv2(F.gelu(self.pwconv1(_apply_norm(self.norm, hidden, condition))))
        return x + (self.gamma * hidden).transpose(1, 2)


class VocosBackbone(nn.Module):
    """Input conv and norm, ConvNeXt blocks, final layer norm. Takes ``[B, C_in, T]``, returns channel-last
    ``[B, T, dim]``."""

    def __init__(
        self, input_channels: int, dim: int, intermediate_dim: int, num_layers: int, condition_dim: int | None = None
    ):
        super().__init__()
        self.embed = nn.Conv1d(input_channels, dim, CONVNEXT_KERNEL, padding=CONVNEXT_KERNEL // 2)
        self.norm = _channel_last_norm(dim, condition_dim)
        self.convnext = nn.ModuleList(ConvNeXtBlock(dim, intermediate_dim, condition_dim) for _ in range(num_layers))
        self.final_layer_norm = nn.LayerNorm(dim, eps=_NORM_EPS)

    def forward(
        self,
        x: torch.Tensor,
        condition: torch.Tensor | None = None,
        frame_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embed(zero_padding_frames(x, frame_mask))
        x = _apply_norm(self.norm, x.transpose(1, 2), condition).transpose(1, 2)
        for block in self.convnext:
            x = block(x, condition, frame_mask)
        return self.final_layer_norm(x.transpose(1, 2))


class TripledIdentity(nn.Module):
    """The official ``SamplingBlock`` at ratio 1: its resampled branch and its two skip branches are all the input,
    and it returns their sum."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3 * x


class ResampleStage(nn.Sequential):
    """One entry of the official ``downsample`` stack at ratio 1: ``TripledIdentity`` then a two-layer backbone.
    Channel-last ``[B, T, C]`` in and out."""

    def __init__(self, dim: int, intermediate_dim: int):
        super().__init__(TripledIdentity(), VocosBackbone(dim, dim, intermediate_dim, RESAMPLE_STAGE_LAYERS))

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self[1](self[0](x).transpose(1, 2), frame_mask=frame_mask)


class FeatureEncoder(nn.Module):
    """``encoder``: wav2vec2 features ``[B, T, input_channels]`` to latents ``[B, out_channels, T]``."""

    def __init__(self, config: FeatureEncoderConfig):
        super().__init__()
        dim, intermediate = config.vocos_dim, config.vocos_intermediate_dim
        self.encoder = VocosBackbone(config.input_channels, dim, intermediate, config.vocos_num_layers)
        self.downsample = nn.ModuleList(ResampleStage(dim, intermediate) for _ in config.sample_ratios)
        self.project = nn.Linear(dim, config.out_channels)

    def forward(self, features: torch.Tensor, frame_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.encoder(features.transpose(1, 2), frame_mask=frame_mask)
        for stage in self.downsample:
            x = stage(x, frame_mask)
        return self.project(x).transpose(1, 2)


class FeatureDecoder(nn.Module):
    """``prenet``/``postnet``: ``[B, input_channels, T]`` (and a condition ``[B, condition_dim]`` for the prenet)
    to ``[B, out_channels, T]``."""

    def __init__(self, config: FeatureDecoderConfig):
        super().__init__()
        dim, intermediate = config.vocos_dim, config.vocos_intermediate_dim
        self.linear_pre = nn.Linear(config.input_channels, dim)
        self.downsample = nn.ModuleList(ResampleStage(dim, intermediate) for _ in config.sample_ratios)
        self.vocos_backbone = VocosBackbone(
            dim, dim, intermediate, config.vocos_num_layers, condition_dim=config.condition_dim
        )
        self.linear = nn.Linear(dim, config.out_channels)
        self.use_tanh_at_final = config.use_tanh_at_final

    def forward(self, x: torch.Tensor, condition: torch.Tensor | None = None) -> torch.Tensor:
        x = self.linear_pre(x.transpose(1, 2))
        for stage in self.downsample:
            x = stage(x)
        x = self.linear(self.vocos_backbone(x.transpose(1, 2), condition=condition)).transpose(1, 2)
        return torch.tanh(x) if self.use_tanh_at_final else x


_SNAKE_BLOCK = 1024

if triton is not None:

    @triton.jit
    def _fused_snake_kernel(x_ptr, alpha_ptr, out_ptr, numel, length, channels, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < numel
        x = tl.load(x_ptr + offsets, mask=inside).to(tl.float32)
        alpha = tl.load(alpha_ptr + (offsets // length) % channels, mask=inside).to(tl.float32)
        wave = tl.sin(alpha * x)
        out = x + (1.0 / (alpha + 1e-9)) * (wave * wave)
        tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=inside)


class Snake1d(nn.Module):
    """The snake activation ``x + sin(alpha x)^2 / alpha`` with a learned per-channel ``alpha``.

    On a GPU with Triton it runs as one fused kernel (computing in float32), which makes the whole vocoder about a
    quarter faster than the five elementwise kernels of the plain expression. Inference only: the fused kernel has no
    backward.
    """

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is not None and (x.is_cuda or _INTERPRETED):
            x = x.contiguous()
            out = torch.empty_like(x)
            grid = (triton.cdiv(x.numel(), _SNAKE_BLOCK),)
            _fused_snake_kernel[grid](x, self.alpha, out, x.numel(), x.shape[2], x.shape[1], BLOCK=_SNAKE_BLOCK)
            return out
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(channels),
            WeightNormConv1d(
                channels,
                channels,
                RESIDUAL_UNIT_KERNEL,
                dilation=dilation,
                padding=dilation * (RESIDUAL_UNIT_KERNEL // 2),
            ),
            Snake1d(channels),
            WeightNormConv1d(channels, channels, kernel_size=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class UpsampleBlock(nn.Module):
    """Snake, a transposed conv that upsamples by ``rate`` and halves the channels, three dilated residual units."""

    def __init__(self, in_channels: int, out_channels: int, rate: int, kernel_size: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(in_channels),
            WeightNormConvTranspose1d(
                in_channels, out_channels, kernel_size, stride=rate, padding=(kernel_size - rate) // 2
            ),
            *(ResidualUnit(out_channels, dilation) for dilation in RESIDUAL_UNIT_DILATIONS),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class WaveGenerator(nn.Module):
    """``decoder``: ``[B, input_channel, T]`` to a waveform ``[B, 1, T * prod(rates)]`` in [-1, 1]."""

    def __init__(self, config: WaveGeneratorConfig):
        super().__init__()
        channels = [config.channels // 2**stage for stage in range(len(config.rates) + 1)]
        self.model = nn.Sequential(
            WeightNormConv1d(
                config.input_channel, channels[0], GENERATOR_OUTER_KERNEL, padding=GENERATOR_OUTER_KERNEL // 2
            ),
            *(
                UpsampleBlock(channels[stage], channels[stage + 1], rate, kernel)
                for stage, (rate, kernel) in enumerate(zip(config.rates, config.kernel_sizes, strict=True))
            ),
            Snake1d(channels[-1]),
            WeightNormConv1d(channels[-1], 1, GENERATOR_OUTER_KERNEL, padding=GENERATOR_OUTER_KERNEL // 2),
            nn.Tanh(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)
