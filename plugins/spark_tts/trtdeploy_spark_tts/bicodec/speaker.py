"""BiCodec's global tokenizer: mel spectrogram to 32 speaker tokens, and those tokens back to a speaker vector.

Tokenizing runs an ECAPA-TDNN trunk over the mel frames, resamples its frame latents to a fixed number of latents
with a perceiver, and quantizes each latent with finite scalar quantization (FSQ). Detokenizing only needs the FSQ
code values and two linear maps. Widths that the official code fixes rather than reads from the config are constants
here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import SpeakerEncoderConfig

ECAPA_CHANNELS = 512
ECAPA_LATENT_CHANNELS = 3 * 512
ECAPA_RES2_SPLITS = 8
ECAPA_SE_BOTTLENECK = 128
ECAPA_DILATIONS = (2, 3, 4)
PERCEIVER_DEPTH = 2
PERCEIVER_HEADS = 8
PERCEIVER_HEAD_DIM = 64
PERCEIVER_FF_MULT = 4
FSQ_BOUND_EPS = 1e-3


class ConvReluNorm(nn.Module):
    """Conv, ReLU, then batch norm (in that order, as the official ECAPA-TDNN has it)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1, padding: int = 0):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=padding)
        self.bn = nn.BatchNorm1d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(F.relu(self.conv(x)))


class Res2DilatedConv(nn.Module):
    """Res2Net-style multi-scale conv: the channels are split in groups; each group but the last runs through its own
    dilated conv after adding the previous group's output, the last group passes through unchanged."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.width = channels // ECAPA_RES2_SPLITS
        self.convs = nn.ModuleList(
            nn.Conv1d(self.width, self.width, 3, padding=dilation, dilation=dilation)
            for _ in range(ECAPA_RES2_SPLITS - 1)
        )
        self.bns = nn.ModuleList(nn.BatchNorm1d(self.width) for _ in range(ECAPA_RES2_SPLITS - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.split(x, self.width, dim=1)
        outputs = []
        carried = None
        for group, conv, bn in zip(groups[:-1], self.convs, self.bns, strict=True):
            carried = group if carried is None else carried + group
            carried = bn(F.relu(conv(carried)))
            outputs.append(carried)
        outputs.append(groups[-1])
        return torch.cat(outputs, dim=1)


class SqueezeExcite(nn.Module):
    """Rescales each channel by a gate computed from the time-averaged channels."""

    def __init__(self, channels: int):
        super().__init__()
        self.linear1 = nn.Linear(channels, ECAPA_SE_BOTTLENECK)
        self.linear2 = nn.Linear(ECAPA_SE_BOTTLENECK, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))
        return x * gate.unsqueeze(2)


class SERes2Block(nn.Module):
    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.se_res2block = nn.Sequential(
            ConvReluNorm(channels, channels),
            Res2DilatedConv(channels, dilation),
            ConvReluNorm(channels, channels),
            SqueezeExcite(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_res2block(x)


class EcapaTrunk(nn.Module):
    """ECAPA-TDNN up to its frame latents ``[B, 1536, T]``. The official model's attentive pooling and x-vector head
    only serve training, so they are left out."""

    def __init__(self, mel_channels: int):
        super().__init__()
        self.layer1 = ConvReluNorm(mel_channels, ECAPA_CHANNELS, kernel_size=5, padding=2)
        self.layer2 = SERes2Block(ECAPA_CHANNELS, ECAPA_DILATIONS[0])
        self.layer3 = SERes2Block(ECAPA_CHANNELS, ECAPA_DILATIONS[1])
        self.layer4 = SERes2Block(ECAPA_CHANNELS, ECAPA_DILATIONS[2])
        self.conv = nn.Conv1d(len(ECAPA_DILATIONS) * ECAPA_CHANNELS, ECAPA_LATENT_CHANNELS, kernel_size=1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        first = self.layer2(self.layer1(mels))
        second = self.layer3(first)
        third = self.layer4(second)
        return F.relu(self.conv(torch.cat([first, second, third], dim=1)))


class CrossAttention(nn.Module):
    """Multi-head attention of the latents over themselves and the context (keys and values from both)."""

    def __init__(self, dim: int):
        super().__init__()
        inner = PERCEIVER_HEADS * PERCEIVER_HEAD_DIM
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (PERCEIVER_HEADS, PERCEIVER_HEAD_DIM)).transpose(1, 2)

    def forward(self, latents: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        keys, values = self.to_kv(torch.cat([latents, context], dim=1)).chunk(2, dim=-1)
        queries, keys, values = (self._split_heads(t) for t in (self.to_q(latents), keys, values))
        scores = torch.matmul(queries, keys.transpose(-1, -2)) * PERCEIVER_HEAD_DIM**-0.5
        attended = torch.matmul(scores.softmax(dim=-1), values)
        return self.to_out(attended.transpose(1, 2).flatten(2))


class GeluGate(nn.Module):
    """Splits the channels in half and returns ``first_half * gelu(second_half)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, gate = x.chunk(2, dim=-1)
        return F.gelu(gate) * values


def _gated_feed_forward(dim: int) -> nn.Sequential:
    inner = int(dim * PERCEIVER_FF_MULT * 2 / 3)
    return nn.Sequential(nn.Linear(dim, 2 * inner), GeluGate(), nn.Linear(inner, dim))


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class PerceiverResampler(nn.Module):
    """Learned latents ``[token_num, dim]`` that attend to the projected frame latents: ``[B, T, context_dim]`` to
    ``[B, token_num, dim]``."""

    def __init__(self, dim: int, context_dim: int, num_latents: int):
        super().__init__()
        self.proj_context = nn.Linear(context_dim, dim)
        self.latents = nn.Parameter(torch.zeros(num_latents, dim))
        self.layers = nn.ModuleList(
            nn.ModuleList([CrossAttention(dim), _gated_feed_forward(dim)]) for _ in range(PERCEIVER_DEPTH)
        )
        self.norm = RMSNorm(dim)

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        context = self.proj_context(context)
        latents = self.latents.expand(context.shape[0], -1, -1)
        for attention, feed_forward in self.layers:
            latents = attention(latents, context) + latents
            latents = feed_forward(latents) + latents
        return self.norm(latents)


class FiniteScalarQuantizer(nn.Module):
    """FSQ: projects to one value per level count, bounds each with a tanh, rounds to a grid of ``levels[i]`` points,
    and numbers the grid points in mixed radix (first level least significant).

    The official model wraps this in a residual FSQ with one quantizer, whose only extra step scales by 1.
    """

    def __init__(self, dim: int, levels: list[int], *, encode: bool, decode: bool):
        super().__init__()
        self.project_in = nn.Linear(dim, len(levels)) if encode else None
        self.project_out = nn.Linear(len(levels), dim) if decode else None
        # Derived from the config: not in the state dict.
        self.register_buffer("levels", torch.tensor(levels), persistent=False)
        self.register_buffer(
            "radix", torch.tensor([math.prod(levels[:digit]) for digit in range(len(levels))]), persistent=False
        )

    def encode(self, latents: torch.Tensor) -> torch.Tensor:
        """``[..., dim]`` to indices ``[...]``, computed in float32 whatever the model's dtype."""
        values = self.project_in(latents).float()
        half_range = (self.levels - 1) * (1 + FSQ_BOUND_EPS) / 2
        # Even level counts get grid points at half-integers; the shift keeps zero input at the grid's centre.
        offset = torch.where(self.levels % 2 == 0, 0.5, 0.0)
        shift = torch.atanh(offset / half_range)
        bounded = torch.tanh(values + shift) * half_range - offset
        digits = torch.round(bounded).long() + self.levels // 2
        return (digits * self.radix).sum(dim=-1)

    def decode(self, indices: torch.Tensor) -> torch.Tensor:
        """Indices ``[...]`` to ``[..., dim]``: each digit becomes a code value in [-1, 1), then ``project_out``."""
        digits = (indices.unsqueeze(-1) // self.radix) % self.levels
        half_width = self.levels // 2
        codes = (digits - half_width) / half_width
        return self.project_out(codes.to(self.project_out.weight.dtype))


class SpeakerEncoder(nn.Module):
    """``speaker_encoder``: mel ``[B, num_mels, T]`` to global tokens ``[B, token_num]`` (``encode``), and global
    tokens to the speaker vector ``[B, out_dim]`` that conditions the prenet (``decode``)."""

    def __init__(self, config: SpeakerEncoderConfig, *, encode: bool, decode: bool):
        super().__init__()
        self.speaker_encoder = EcapaTrunk(config.input_dim) if encode else None
        self.perceiver_sampler = (
            PerceiverResampler(config.latent_dim, ECAPA_LATENT_CHANNELS, config.token_num) if encode else None
        )
        self.quantizer = FiniteScalarQuantizer(config.latent_dim, config.fsq_levels, encode=encode, decode=decode)
        self.project = nn.Linear(config.latent_dim * config.token_num, config.out_dim) if decode else None

    def tokenize(self, mels: torch.Tensor) -> torch.Tensor:
        frame_latents = self.speaker_encoder(mels)
        return self.quantizer.encode(self.perceiver_sampler(frame_latents.transpose(1, 2)))

    def detokenize(self, tokens: torch.Tensor) -> torch.Tensor:
        latents = self.quantizer.decode(tokens)
        # The official model flattens the latents channel-major: [B, latent_dim, token_num] -> [B, latent_dim * N].
        return self.project(latents.transpose(1, 2).flatten(1))
