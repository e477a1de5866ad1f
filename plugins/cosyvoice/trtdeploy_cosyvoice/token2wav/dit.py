"""CosyVoice3's flow-matching estimator: a diffusion transformer (DiT) over mel frames.

It predicts the velocity of the flow at time ``t`` from the noisy mel ``x``, the token features ``mu``, the speaker
vector and the prompt mel ``cond``. The four are projected to the model width per frame, given a causal convolutional
position embedding, and run through transformer blocks whose layer norms are modulated by the time embedding
(adaLN). Attention sees the whole sequence, or, when streaming, the chunks up to its own.

Tensors are channel-first (``[B, C, M]``) at the interface, channel-last (``[B, M, C]``) inside. Batches are right
padded: ``mask`` is 1 on each row's frames and 0 past its end. The convolutions only look back and attention skips
padded keys, so padding reaches no valid frame; the output past a row's end is not zeroed (as in the official model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trtdeploy import UsageError

from .unet import frame_attention_mask, sinusoidal_time_embedding

#: Width of the sinusoidal time embedding, before its MLP.
_TIME_FREQUENCY_DIM = 256
_LAYER_NORM_EPS = 1e-6
_POSITION_CONV_KERNEL = 31
_POSITION_CONV_GROUPS = 16
_ROTARY_BASE = 10000.0
#: A block's modulation: shift, scale and gate for attention, then for the feed-forward.
_BLOCK_MODULATIONS = 6
#: The output's modulation: scale, then shift.
_OUTPUT_MODULATIONS = 2


@dataclass(frozen=True)
class DiTEstimatorConfig:
    """The ``estimator`` arguments of the official cosyvoice3.yaml, with the released model's values as defaults."""

    dim: int = 1024
    #: Transformer blocks.
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    #: Feed-forward width as a multiple of ``dim``.
    ff_mult: int = 2
    mel_dim: int = 80
    mu_dim: int = 80
    spk_dim: int = 80
    #: The official model projects to ``mel_dim`` and ignores this; it must equal ``mel_dim``.
    out_channels: int = 80
    #: Only active in training mode.
    dropout: float = 0.1
    #: Attention chunk, in mel frames, when streaming.
    static_chunk_size: int = 50
    #: Kept for the yaml's sake: the official chunk mask ignores it and always gives the full left context.
    num_decoding_left_chunks: int = -1

    def __post_init__(self) -> None:
        if self.out_channels != self.mel_dim:
            raise UsageError(
                f"estimator out_channels {self.out_channels} differs from mel_dim {self.mel_dim}",
                hint="the DiT predicts one value per mel bin: set out_channels to mel_dim (80 for CosyVoice3)",
            )
        if self.dim % _POSITION_CONV_GROUPS:
            raise UsageError(
                f"estimator dim {self.dim} is not a multiple of {_POSITION_CONV_GROUPS}",
                hint=f"the position convolutions have {_POSITION_CONV_GROUPS} groups: pick a dim divisible by that",
            )
        if self.dim_head % 2:
            raise UsageError(
                f"estimator dim_head {self.dim_head} is odd",
                hint="rotary embedding turns channel pairs: use an even dim_head (64 for CosyVoice3)",
            )
        if self.static_chunk_size < 1:
            raise UsageError(
                f"estimator static_chunk_size must be positive, not {self.static_chunk_size}",
                hint="set it to chunk_size x token_mel_ratio (50 for CosyVoice3)",
            )

    @property
    def input_channels(self) -> int:
        """Channels of ``[x, cond, mu, spks]`` concatenated per frame."""
        return 2 * self.mel_dim + self.mu_dim + self.spk_dim


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Layer norm (no affine) of ``[B, M, C]``, then scaled by ``1 + scale`` and shifted, both ``[B, C]``."""
    return F.layer_norm(x, x.shape[-1:], eps=_LAYER_NORM_EPS) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimeEmbedding(nn.Module):
    """The time's sinusoidal embedding through linear, SiLU, linear."""

    def __init__(self, dim: int):
        super().__init__()
        self.time_mlp = nn.Sequential(nn.Linear(_TIME_FREQUENCY_DIM, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """``[B]`` -> ``[B, dim]``; the sinusoids are cast to the MLP's dtype (the official model casts them to
        ``t``'s, which is the same wherever it runs: both are float32 under autocast, or both half precision)."""
        first_linear = self.time_mlp[0]
        return self.time_mlp(sinusoidal_time_embedding(t, _TIME_FREQUENCY_DIM, first_linear.weight.dtype))


class CausalConvPositionEmbedding(nn.Module):
    """Two grouped convolutions, each left padded (frame ``i`` sees ``i - 30 .. i``) and followed by Mish."""

    def __init__(self, dim: int):
        super().__init__()

        def conv() -> nn.Sequential:
            return nn.Sequential(nn.Conv1d(dim, dim, _POSITION_CONV_KERNEL, groups=_POSITION_CONV_GROUPS), nn.Mish())

        self.conv1 = conv()
        self.conv2 = conv()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, M, C]`` -> ``[B, M, C]``."""
        hidden = x.transpose(1, 2)
        for conv in (self.conv1, self.conv2):
            hidden = conv(F.pad(hidden, (_POSITION_CONV_KERNEL - 1, 0)))
        return hidden.transpose(1, 2)


class InputEmbedding(nn.Module):
    """``[x, cond, mu, spks]`` per frame projected to the model width, plus its causal convolutional embedding."""

    def __init__(self, config: DiTEstimatorConfig):
        super().__init__()
        self.proj = nn.Linear(config.input_channels, config.dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(config.dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor) -> torch.Tensor:
        speaker = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        hidden = self.proj(torch.cat([x, cond, mu, speaker], dim=-1))
        return self.conv_pos_embed(hidden) + hidden


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over the first ``dim`` channels, in interleaved pairs (GPT-J style): channels
    ``(2i, 2i + 1)`` of frame ``p`` turn by the angle ``p * inv_freq[i]``.

    ``inv_freq`` is a persistent buffer because the official checkpoint holds it.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / _ROTARY_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))

    def angles(self, frames: int) -> torch.Tensor:
        """``[M, dim / 2]`` angles, in float32 whatever the model's dtype (the official model computes them in
        float32 with autocast off; half-precision positions would be off by whole radians for long inputs)."""
        position = torch.arange(frames, device=self.inv_freq.device, dtype=torch.float32)
        return position.unsqueeze(1) * self.inv_freq.float().unsqueeze(0)

    @staticmethod
    def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Turn the first ``2 * angles.shape[-1]`` channels of ``x`` ``[B, M, C]`` (in float32, as the official
        model does); the other channels pass unchanged."""
        rotary_channels = 2 * angles.shape[-1]
        pairs = x[..., :rotary_channels].unflatten(-1, (-1, 2)).to(angles.dtype)
        even, odd = pairs.unbind(-1)
        cos, sin = angles.cos(), angles.sin()
        turned = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
        return torch.cat([turned.to(x.dtype), x[..., rotary_channels:]], dim=-1)


class Modulation(nn.Module):
    """``parts`` per-channel vectors ``[B, dim]`` from the time embedding: a linear map of its SiLU, split."""

    def __init__(self, dim: int, parts: int):
        super().__init__()
        self.linear = nn.Linear(dim, parts * dim)
        self.parts = parts

    def forward(self, time: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.linear(F.silu(time)).chunk(self.parts, dim=-1)


class SelfAttention(nn.Module):
    """Multi-head self-attention with biased projections, rotary embedding and a boolean key mask."""

    def __init__(self, config: DiTEstimatorConfig):
        super().__init__()
        self.heads = config.heads
        inner_dim = config.heads * config.dim_head
        self.to_q = nn.Linear(config.dim, inner_dim)
        self.to_k = nn.Linear(config.dim, inner_dim)
        self.to_v = nn.Linear(config.dim, inner_dim)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, config.dim), nn.Dropout(config.dropout))

    def forward(
        self, x: torch.Tensor, visible: torch.Tensor, valid_frames: torch.Tensor, angles: torch.Tensor
    ) -> torch.Tensor:
        """``x`` ``[B, M, C]``; ``visible`` ``[B, 1, M, M]``; ``valid_frames`` ``[B, M, 1]`` boolean."""
        batch, frames, _ = x.shape
        # The official model turns q and k before splitting them into heads, so only the first head's channels
        # get a position; the other heads have none. Reproduced on purpose: the released weights expect it.
        query = RotaryEmbedding.rotate(self.to_q(x), angles)
        key = RotaryEmbedding.rotate(self.to_k(x), angles)

        def heads(projected: torch.Tensor) -> torch.Tensor:
            return projected.view(batch, frames, self.heads, -1).transpose(1, 2)

        attended = F.scaled_dot_product_attention(heads(query), heads(key), heads(self.to_v(x)), attn_mask=visible)
        output = self.to_out(attended.transpose(1, 2).reshape(batch, frames, -1))
        return output.masked_fill(~valid_frames, 0.0)


class FeedForward(nn.Module):
    """Linear, tanh-approximated GELU, linear."""

    def __init__(self, config: DiTEstimatorConfig):
        super().__init__()
        inner_dim = config.ff_mult * config.dim
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(config.dim, inner_dim), nn.GELU(approximate="tanh")),
            nn.Dropout(config.dropout),
            nn.Linear(inner_dim, config.dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    """Attention and feed-forward on time-modulated layer norms, each added to its input through a time gate."""

    def __init__(self, config: DiTEstimatorConfig):
        super().__init__()
        self.attn_norm = Modulation(config.dim, _BLOCK_MODULATIONS)
        self.attn = SelfAttention(config)
        self.ff = FeedForward(config)

    def forward(
        self,
        x: torch.Tensor,
        time: torch.Tensor,
        visible: torch.Tensor,
        valid_frames: torch.Tensor,
        angles: torch.Tensor,
    ) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(time)
        attended = self.attn(_modulate(x, shift_msa, scale_msa), visible, valid_frames, angles)
        x = x + gate_msa.unsqueeze(1) * attended
        return x + gate_mlp.unsqueeze(1) * self.ff(_modulate(x, shift_mlp, scale_mlp))


class DiTEstimator(nn.Module):
    """The velocity ``[B, mel_dim, M]`` of the flow (not zeroed past each row's end)."""

    def __init__(self, config: DiTEstimatorConfig | None = None):
        super().__init__()
        self.config = config = config or DiTEstimatorConfig()
        self.time_embed = TimeEmbedding(config.dim)
        self.input_embed = InputEmbedding(config)
        self.rotary_embed = RotaryEmbedding(config.dim_head)
        self.transformer_blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.depth))
        self.norm_out = Modulation(config.dim, _OUTPUT_MODULATIONS)
        self.proj_out = nn.Linear(config.dim, config.mel_dim)

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
        """``x``, ``mu``, ``cond`` ``[B, mel_dim, M]``; ``mask`` ``[B, 1, M]``; ``t`` ``[B]``; ``spks``
        ``[B, spk_dim]``. ``streaming`` limits attention to chunks of ``static_chunk_size`` frames."""
        time = self.time_embed(t)
        hidden = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        visible = frame_attention_mask(mask, self.config.static_chunk_size if streaming else None)
        valid_frames = mask.bool().transpose(1, 2)
        angles = self.rotary_embed.angles(hidden.shape[1])
        for block in self.transformer_blocks:
            hidden = block(hidden, time, visible, valid_frames, angles)
        scale, shift = self.norm_out(time)
        return self.proj_out(_modulate(hidden, shift, scale)).transpose(1, 2)
