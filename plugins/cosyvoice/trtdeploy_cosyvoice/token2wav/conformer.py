"""CosyVoice2's token encoder: a conformer over 25 Hz token embeddings, upsampled to the 50 Hz mel rate, then more
conformer layers (the checkpoint's ``encoder.*``), and the lookahead convolution that CosyVoice3 uses alone.

The attention is Transformer-XL's relative-position attention as ESPnet writes it: the score of query i for key j is
``((q_i + u)·k_j + (q_i + v)·P(i - j)) / sqrt(d)`` with a sinusoidal table P of the signed distance passed through
``linear_pos``. Layers are pre-norm with a SiLU feed-forward and no convolution module.

Streaming uses block-causal masks over the whole sequence (prompt included) from index 0: a frame sees every frame
of its own chunk and all earlier chunks, 25 tokens before the upsampling and 50 frames after it. The lookahead
convolution sees 3 tokens to the right; while a request is still streaming, each row's last 3 tokens are that right
context only and yield no output of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: The encoder doubles the frame rate: 25 Hz tokens to 50 Hz mel frames.
UPSAMPLE_STRIDE = 2


@dataclass(frozen=True)
class UpsampleConformerEncoderConfig:
    """The yaml's ``encoder`` arguments (CosyVoice2) that shape the network, with the released model's values."""

    input_size: int = 512
    output_size: int = 512
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    #: Streaming chunk in tokens (doubled after the upsampling).
    static_chunk_size: int = 25
    #: Layers after the upsampling (fixed in upstream's code, not a yaml argument).
    num_up_blocks: int = 4


def padding_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """Bool ``[B, max_length]``: True at each row's valid frames."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


def chunk_visibility(frames: int, chunk_size: int, device: torch.device) -> torch.Tensor:
    """Bool ``[T, T]``: query ``i`` sees key ``j`` when ``j`` is before the end of ``i``'s chunk (chunks counted from
    frame 0, every earlier chunk visible)."""
    positions = torch.arange(frames, device=device)
    chunk_end = (positions // chunk_size + 1) * chunk_size
    return positions[None, :] < chunk_end[:, None]


def attention_mask(lengths: torch.Tensor, max_length: int, chunk_size: int | None) -> torch.Tensor:
    """Bool keys mask: ``[B, 1, T]`` (padding only) or, with a chunk size, ``[B, T, T]`` block-causal and padding."""
    keys = padding_mask(lengths, max_length)[:, None, :]
    if chunk_size is None:
        return keys
    return keys & chunk_visibility(max_length, chunk_size, lengths.device)[None]


def relative_position_table(length: int, d_model: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Sinusoids ``[1, 2·length - 1, d_model]`` of the distances ``length-1, …, 0, …, -(length-1)``.

    Computed in float32 (as upstream builds its table) and then cast.
    """
    distances = torch.arange(length - 1, -length, -1, device=device, dtype=torch.float32)[:, None]
    frequencies = torch.exp(
        torch.arange(0, d_model, 2, device=device, dtype=torch.float32) * -(math.log(10000.0) / d_model)
    )
    angles = distances * frequencies
    table = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)
    return table[None].to(dtype)


class LinearEmbedding(nn.Module):
    """Linear, LayerNorm, then the ×√d scale of the positional-encoding step (keys ``out.0``, ``out.1``)."""

    def __init__(self, input_size: int, output_size: int):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(input_size, output_size), nn.LayerNorm(output_size, eps=1e-5))
        self.xscale = math.sqrt(output_size)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return self.out(xs) * self.xscale


class RelPositionMultiHeadedAttention(nn.Module):
    def __init__(self, heads: int, size: int):
        super().__init__()
        if size % heads:
            raise ValueError(f"attention size {size} is not a multiple of {heads} heads")
        self.heads, self.head_dim = heads, size // heads
        self.linear_q = nn.Linear(size, size)
        self.linear_k = nn.Linear(size, size)
        self.linear_v = nn.Linear(size, size)
        self.linear_out = nn.Linear(size, size)
        self.linear_pos = nn.Linear(size, size, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.empty(heads, self.head_dim))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)

    def _split_heads(self, xs: torch.Tensor) -> torch.Tensor:
        return xs.view(xs.size(0), xs.size(1), self.heads, self.head_dim)

    def forward(self, xs: torch.Tensor, mask: torch.Tensor, position_table: torch.Tensor) -> torch.Tensor:
        """``xs`` [B, T, C]; ``mask`` bool [B, 1 or T, T] over keys; ``position_table`` [1, 2T-1, C]."""
        batch, length, _ = xs.shape
        queries = self._split_heads(self.linear_q(xs))
        keys = self._split_heads(self.linear_k(xs)).transpose(1, 2)
        values = self._split_heads(self.linear_v(xs)).transpose(1, 2)
        positions = self._split_heads(self.linear_pos(position_table)).transpose(1, 2)
        content = torch.matmul((queries + self.pos_bias_u).transpose(1, 2), keys.transpose(-2, -1))
        by_distance = torch.matmul((queries + self.pos_bias_v).transpose(1, 2), positions.transpose(-2, -1))
        # Column c of row i holds distance length-1-c, so key j (distance i-j) sits at column length-1-i+j: each
        # row's window starts one column further left, a stride of 2·length - 2 through the contiguous table.
        by_distance = by_distance.contiguous()
        row_stride = 2 * length - 1
        by_distance = by_distance.as_strided(
            (batch, self.heads, length, length),
            (self.heads * length * row_stride, length * row_stride, row_stride - 1, 1),
            by_distance.storage_offset() + length - 1,
        )
        scores = (content + by_distance) / math.sqrt(self.head_dim)
        hidden = ~mask[:, None]
        weights = torch.softmax(scores.masked_fill(hidden, -float("inf")), dim=-1).masked_fill(hidden, 0.0)
        context = torch.matmul(weights, values).transpose(1, 2).reshape(batch, length, -1)
        return self.linear_out(context)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, size: int, hidden: int):
        super().__init__()
        self.w_1 = nn.Linear(size, hidden)
        self.w_2 = nn.Linear(hidden, size)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(xs)))


class ConformerLayer(nn.Module):
    """Pre-norm self-attention and feed-forward, each added to its input (no macaron, no convolution module)."""

    def __init__(self, size: int, heads: int, linear_units: int):
        super().__init__()
        self.self_attn = RelPositionMultiHeadedAttention(heads, size)
        self.feed_forward = PositionwiseFeedForward(size, linear_units)
        self.norm_mha = nn.LayerNorm(size, eps=1e-12)
        self.norm_ff = nn.LayerNorm(size, eps=1e-12)

    def forward(self, xs: torch.Tensor, mask: torch.Tensor, position_table: torch.Tensor) -> torch.Tensor:
        xs = xs + self.self_attn(self.norm_mha(xs), mask, position_table)
        return xs + self.feed_forward(self.norm_ff(xs))


class PreLookaheadLayer(nn.Module):
    """A convolution that sees ``pre_lookahead_len`` frames ahead, a causal one, and a residual, on ``[B, T, C]``.

    Frames past each row's length read as zeros, so a row's last frames see exactly what they would alone; a caller
    that streams keeps each row's last ``pre_lookahead_len`` frames as context and drops their outputs.
    """

    def __init__(self, in_channels: int, channels: int, pre_lookahead_len: int):
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3)

    def forward(self, xs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        valid = padding_mask(lengths, xs.size(1))[:, None, :].to(xs.dtype)
        hidden = F.pad(xs.transpose(1, 2) * valid, (0, self.pre_lookahead_len))
        hidden = F.leaky_relu(self.conv1(hidden))
        hidden = self.conv2(F.pad(hidden, (self.conv2.kernel_size[0] - 1, 0)))
        return hidden.transpose(1, 2) + xs


class Upsample1D(nn.Module):
    """Nearest-neighbour ×stride in time, then a causal convolution (kernel 2·stride + 1)."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, kernel_size=2 * stride + 1)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        """``xs`` [B, C, T] to [B, C, stride·T]."""
        upsampled = F.interpolate(xs, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(upsampled, (2 * self.stride, 0)))


class UpsampleConformerEncoder(nn.Module):
    """Embedded tokens ``[B, T, input_size]`` to hidden frames ``[B, 2·T', output_size]`` at the mel rate."""

    def __init__(self, config: UpsampleConformerEncoderConfig, pre_lookahead_len: int = 3):
        super().__init__()
        self.config = config
        size = config.output_size
        self.embed = LinearEmbedding(config.input_size, size)
        self.pre_lookahead_layer = PreLookaheadLayer(size, size, pre_lookahead_len)
        self.encoders = nn.ModuleList(
            ConformerLayer(size, config.attention_heads, config.linear_units) for _ in range(config.num_blocks)
        )
        self.up_layer = Upsample1D(size, UPSAMPLE_STRIDE)
        self.up_embed = LinearEmbedding(size, size)
        self.up_encoders = nn.ModuleList(
            ConformerLayer(size, config.attention_heads, config.linear_units) for _ in range(config.num_up_blocks)
        )
        self.after_norm = nn.LayerNorm(size, eps=1e-5)

    def forward(
        self, xs: torch.Tensor, lengths: torch.Tensor, *, right_context: int, streaming: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode right-padded rows; returns the frames and their lengths ``2·(lengths - right_context)``.

        :param xs: embedded tokens ``[B, T, input_size]``, zero or anything past each row's length.
        :param lengths: valid tokens per row, the right context included.
        :param right_context: how many of each row's last tokens only feed the lookahead (0 when finalizing).
        :param streaming: block-causal chunk masks instead of full attention.
        """
        xs = self.pre_lookahead_layer(self.embed(xs), lengths)
        lengths = lengths - right_context
        xs = xs[:, : int(lengths.max())]
        xs = self._attend(self.encoders, xs, lengths, self.config.static_chunk_size if streaming else None)
        xs = self.up_layer(xs.transpose(1, 2)).transpose(1, 2).contiguous()
        lengths = lengths * UPSAMPLE_STRIDE
        xs = self.up_embed(xs)
        chunk = self.config.static_chunk_size * UPSAMPLE_STRIDE if streaming else None
        xs = self._attend(self.up_encoders, xs, lengths, chunk)
        return self.after_norm(xs), lengths

    @staticmethod
    def _attend(layers: nn.ModuleList, xs: torch.Tensor, lengths: torch.Tensor, chunk_size: int | None) -> torch.Tensor:
        mask = attention_mask(lengths, xs.size(1), chunk_size)
        table = relative_position_table(xs.size(1), xs.size(2), xs.device, xs.dtype)
        for layer in layers:
            xs = layer(xs, mask, table)
        return xs
