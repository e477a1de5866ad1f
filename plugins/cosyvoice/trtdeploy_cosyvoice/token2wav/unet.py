"""CosyVoice2's flow-matching estimator: a causal conditional U-Net over mel frames.

It predicts the velocity of the flow at time ``t`` from the noisy mel ``x``, the encoder's mel-rate features ``mu``,
the speaker vector and the prompt mel ``cond``. With one channel level there is no change of resolution: a down
stage, a stack of mid stages and an up stage that concatenates the down stage's output, each a causal residual
block followed by transformer blocks. Every convolution is causal (left padded), so a frame never sees later frames
through a convolution; attention sees the whole sequence, or, when streaming, the chunks up to its own.

Tensors are channel-first (``[B, C, M]``) between stages, channel-last (``[B, M, C]``) inside transformer blocks.
Batches are right padded: ``mask`` is 1 on each row's frames and 0 past its end, and padding reaches no valid frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trtdeploy import UsageError

from .conformer import chunk_visibility

#: The time in [0, 1] is scaled by this before its sinusoidal embedding.
TIME_EMBEDDING_SCALE = 1000.0
#: The attention score bias of a key a query may not see. In float16 it saturates to -inf, as it does in the
#: official model; that is harmless because every query sees at least its row's first frame.
MASKED_KEY_BIAS = -1.0e10
_LAYER_NORM_EPS = 1e-5
_CAUSAL_KERNEL = 3
_FEED_FORWARD_MULT = 4
_TIME_EMBEDDING_MULT = 4
#: The four inputs concatenated along channels: x, mu, the speaker vector and cond, each ``out_channels`` wide.
_INPUT_PARTS = 4


@dataclass(frozen=True)
class UNetEstimatorConfig:
    """The ``estimator`` arguments of the official cosyvoice2.yaml, with the released model's values as defaults."""

    in_channels: int = 320
    out_channels: int = 80
    #: Channels per level; the released model has one level (no down- or upsampling), the only layout supported.
    channels: tuple[int, ...] = (256,)
    #: Only active in training mode.
    dropout: float = 0.0
    attention_head_dim: int = 64
    #: Transformer blocks per stage.
    n_blocks: int = 4
    num_mid_blocks: int = 12
    num_heads: int = 8
    act_fn: str = "gelu"
    #: Attention chunk, in mel frames, when streaming.
    static_chunk_size: int = 50
    #: Kept for the yaml's sake: the official chunk mask ignores it and always gives the full left context.
    num_decoding_left_chunks: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(self.channels))
        if len(self.channels) != 1:
            raise UsageError(
                f"the U-Net estimator has one channel level, not {len(self.channels)} ({list(self.channels)})",
                hint="set estimator channels to a single value, as CosyVoice2's [256]",
            )
        if self.in_channels != _INPUT_PARTS * self.out_channels:
            raise UsageError(
                f"estimator in_channels {self.in_channels} is not 4 x out_channels {self.out_channels}",
                hint="x, mu, the speaker vector and cond are each out_channels wide: set in_channels to 4 x that",
            )
        if self.act_fn != "gelu":
            raise UsageError(f"estimator act_fn {self.act_fn!r} is not supported", hint="use 'gelu', as CosyVoice2")
        if self.static_chunk_size < 1:
            raise UsageError(
                f"estimator static_chunk_size must be positive, not {self.static_chunk_size}",
                hint="set it to chunk_size x token_mel_ratio (50 for CosyVoice2)",
            )

    @property
    def hidden_channels(self) -> int:
        return self.channels[0]

    @property
    def time_embedding_dim(self) -> int:
        return _TIME_EMBEDDING_MULT * self.hidden_channels


def sinusoidal_time_embedding(t: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``[sin | cos]`` of ``1000 t`` times ``dim / 2`` geometric frequencies from 1 to 1/10000, ``[B]`` -> ``[B, dim]``
    in ``dtype``.

    The frequencies are float32 whatever ``t``'s dtype, as in the official model; ``1000 t`` is computed in ``t``'s
    dtype, so a half-precision ``t`` rounds the angles as the official model in half precision does, and a float32
    ``t`` keeps them exact.
    """
    half = dim // 2
    log_step = -math.log(10000.0) / (half - 1)  # one float32 product per frequency, bit for bit the official ones
    frequencies = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * log_step)
    angles = (TIME_EMBEDDING_SCALE * t).unsqueeze(1) * frequencies.unsqueeze(0)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


def frame_attention_mask(mask: torch.Tensor, chunk_size: int | None) -> torch.Tensor:
    """Which keys each query sees, ``[B, 1, M, M]`` boolean (broadcast over heads), from the frame mask ``[B, 1, M]``:
    every valid key of its row, or with ``chunk_size``, only those before the end of its own chunk
    (:func:`~.conformer.chunk_visibility`)."""
    frames = mask.shape[-1]
    visible = mask.bool().unsqueeze(2).expand(-1, -1, frames, -1)
    if chunk_size is not None:
        visible = visible & chunk_visibility(frames, chunk_size, mask.device)
    return visible


def attention_bias(mask: torch.Tensor, chunk_size: int | None, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention bias ``[B, 1, M, M]`` of :func:`frame_attention_mask`: 0 where a key is seen."""
    return torch.where(frame_attention_mask(mask, chunk_size), 0.0, MASKED_KEY_BIAS).to(dtype)


class TimestepMLP(nn.Module):
    """The time embedding's MLP: linear, SiLU, linear."""

    def __init__(self, in_channels: int, time_embedding_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embedding_dim)
        self.linear_2 = nn.Linear(time_embedding_dim, time_embedding_dim)

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(embedding)))


class CausalConv1d(nn.Conv1d):
    """A stride-1 convolution left padded by ``kernel - 1`` zeros: frame ``i`` sees frames ``i - kernel + 1 .. i``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class ChannelLayerNorm(nn.LayerNorm):
    """Layer norm over the channels of a channel-first ``[B, C, M]`` tensor (each frame on its own)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class CausalBlock1D(nn.Module):
    """Causal conv, layer norm over channels, Mish, on the masked input; the output is masked too."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        # Indices 0 and 2 are the checkpoint's (the official block had parameterless transposes at 1 and 3).
        self.block = nn.ModuleDict(
            {
                "0": CausalConv1d(in_channels, out_channels, _CAUSAL_KERNEL),
                "2": ChannelLayerNorm(out_channels, eps=_LAYER_NORM_EPS),
            }
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.mish(self.block["2"](self.block["0"](x * mask))) * mask


class CausalResnetBlock1D(nn.Module):
    """Two causal blocks with the time embedding added between them, plus a 1x1 conv of the input."""

    def __init__(self, in_channels: int, out_channels: int, time_embedding_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_embedding_dim, out_channels))
        self.block1 = CausalBlock1D(in_channels, out_channels)
        self.block2 = CausalBlock1D(out_channels, out_channels)
        self.res_conv = nn.Conv1d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        hidden = self.block1(x, mask) + self.mlp(time).unsqueeze(-1)
        return self.block2(hidden, mask) + self.res_conv(x * mask)


class SelfAttention(nn.Module):
    """Multi-head self-attention with an additive score bias; q/k/v projections without bias."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        inner_dim = num_heads * head_dim
        self.to_q = nn.Linear(dim, inner_dim, bias=False)
        self.to_k = nn.Linear(dim, inner_dim, bias=False)
        self.to_v = nn.Linear(dim, inner_dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        batch, frames, _ = x.shape

        def heads(projection: nn.Linear) -> torch.Tensor:
            return projection(x).view(batch, frames, self.num_heads, -1).transpose(1, 2)

        attended = F.scaled_dot_product_attention(heads(self.to_q), heads(self.to_k), heads(self.to_v), attn_mask=bias)
        return self.to_out(attended.transpose(1, 2).reshape(batch, frames, -1))


class GeluProjection(nn.Module):
    """A linear map followed by exact (erf) GELU."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, dropout: float):
        super().__init__()
        inner_dim = _FEED_FORWARD_MULT * dim
        self.net = nn.Sequential(GeluProjection(dim, inner_dim), nn.Dropout(dropout), nn.Linear(inner_dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerBlock(nn.Module):
    """Pre-norm self-attention and feed-forward, each added to its input; channel-last ``[B, M, C]``."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=_LAYER_NORM_EPS)
        self.attn1 = SelfAttention(dim, num_heads, head_dim, dropout)
        self.norm3 = nn.LayerNorm(dim, eps=_LAYER_NORM_EPS)
        self.ff = FeedForward(dim, dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x), bias)
        return x + self.ff(self.norm3(x))


class UNetStage(nn.ModuleList):
    """A causal residual block, transformer blocks and, outside the mid stages, a causal conv: in the checkpoint,
    ``<stage>.0``, ``<stage>.1.<n>`` and ``<stage>.2``."""

    def __init__(self, in_channels: int, config: UNetEstimatorConfig, with_conv: bool):
        dim = config.hidden_channels
        parts: list[nn.Module] = [
            CausalResnetBlock1D(in_channels, dim, config.time_embedding_dim),
            nn.ModuleList(
                TransformerBlock(dim, config.num_heads, config.attention_head_dim, config.dropout)
                for _ in range(config.n_blocks)
            ),
        ]
        if with_conv:
            parts.append(CausalConv1d(dim, dim, _CAUSAL_KERNEL))
        super().__init__(parts)

    @property
    def causal_conv(self) -> CausalConv1d:
        return self[2]

    def forward(self, x: torch.Tensor, mask: torch.Tensor, time: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The residual block and the transformer blocks (the causal conv, where there is one, is applied apart:
        the down stage's skip connection is taken before it)."""
        resnet, transformer_blocks = self[0], self[1]
        hidden = resnet(x, mask, time).transpose(1, 2)
        for block in transformer_blocks:
            hidden = block(hidden, bias)
        return hidden.transpose(1, 2)


class UNetEstimator(nn.Module):
    """The velocity ``[B, out_channels, M]`` of the flow, zero past each row's end."""

    def __init__(self, config: UNetEstimatorConfig | None = None):
        super().__init__()
        self.config = config = config or UNetEstimatorConfig()
        dim = config.hidden_channels
        self.time_mlp = TimestepMLP(config.in_channels, config.time_embedding_dim)
        self.down_blocks = nn.ModuleList([UNetStage(config.in_channels, config, with_conv=True)])
        self.mid_blocks = nn.ModuleList(UNetStage(dim, config, with_conv=False) for _ in range(config.num_mid_blocks))
        self.up_blocks = nn.ModuleList([UNetStage(2 * dim, config, with_conv=True)])
        self.final_block = CausalBlock1D(dim, dim)
        self.final_proj = nn.Conv1d(dim, config.out_channels, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He-normal weights and zero biases for convolutions and linear maps (unit layer norms), as the official
        model initialises them: random weights keep activations well-scaled through the stages."""
        for module in self.modules():
            if isinstance(module, nn.Conv1d | nn.Linear):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool = False,
    ) -> torch.Tensor:
        """``x``, ``mu``, ``cond`` ``[B, out_channels, M]``; ``mask`` ``[B, 1, M]``; ``t`` ``[B]``; ``spks``
        ``[B, out_channels]``. ``streaming`` limits attention to chunks of ``static_chunk_size`` frames.

        ``t`` may be float32 when the rest is half precision: the time embedding's angles then stay exact."""
        time = self.time_mlp(sinusoidal_time_embedding(t, self.config.in_channels, x.dtype))
        speaker = spks.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        hidden = torch.cat([x, mu, speaker, cond], dim=1)
        chunk_size = self.config.static_chunk_size if streaming else None
        bias = attention_bias(mask, chunk_size, hidden.dtype)

        down, up = self.down_blocks[0], self.up_blocks[0]
        skip = down(hidden, mask, time, bias)
        hidden = down.causal_conv(skip * mask)
        for stage in self.mid_blocks:
            hidden = stage(hidden, mask, time, bias)
        hidden = up(torch.cat([hidden, skip], dim=1), mask, time, bias)
        hidden = self.final_block(up.causal_conv(hidden * mask), mask)
        return self.final_proj(hidden * mask) * mask
