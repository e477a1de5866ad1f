"""The flow of both generations: speech tokens (25 Hz) to an 80-bin mel (50 Hz), conditioned on a prompt's tokens
and mel and on a speaker embedding (the checkpoint's ``flow.pt``).

Each row is its prompt's tokens followed by the tokens to speak. They are embedded and turned into ``mu``, one
80-d vector per mel frame: CosyVoice2 through a conformer that upsamples ×2 (``encoder``, then ``encoder_proj``),
CosyVoice3 through the lookahead convolution alone and each vector repeated twice. The flow-matching ``decoder``
then draws the mel from ``mu``, the speaker vector and ``cond`` (the prompt's mel in the prompt's frames, zeros
after), and the target part of the mel is returned.

How a server calls it (upstream's call sequence; the flow keeps no state between calls):

- offline: all tokens, ``streaming=False, finalize=True``.
- streaming: the tokens received so far, the last 3 of them only as lookahead, ``streaming=True, finalize=False``;
  the mel covers the tokens before the lookahead, and the caller keeps the frames from ``2·offset`` on. The last
  call sends all tokens with ``streaming=False, finalize=True``.

A streaming call reproduces the frames of the full streaming run only when the prompt and the cut both fall on the
25-token chunk grid (upstream pads the first hop so that they do): a cut inside a chunk lets later calls see more
of that chunk.

``streaming`` and ``finalize`` hold for the whole batch (the estimator takes one mask mode): batch requests that
share them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from trtdeploy_cosyvoice.token2wav.cfm import CFMParams, ConditionalFlowMatching
from trtdeploy_cosyvoice.token2wav.conformer import (
    UPSAMPLE_STRIDE,
    PreLookaheadLayer,
    UpsampleConformerEncoder,
    UpsampleConformerEncoderConfig,
    padding_mask,
)
from trtdeploy_cosyvoice.token2wav.conv_kernels import encoder_kernels


@dataclass(frozen=True)
class CosyVoice2FlowConfig:
    """The yaml's ``flow`` arguments of CosyVoice2 (``CausalMaskedDiffWithXvec``), with the released values."""

    input_size: int = 512
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 6561
    pre_lookahead_len: int = 3
    encoder: UpsampleConformerEncoderConfig = field(default_factory=UpsampleConformerEncoderConfig)
    cfm_params: CFMParams = field(default_factory=CFMParams)


@dataclass(frozen=True)
class CosyVoice3FlowConfig:
    """The yaml's ``flow`` arguments of CosyVoice3 (``CausalMaskedDiffWithDiT``), with the released values."""

    input_size: int = 80
    output_size: int = 80
    spk_embed_dim: int = 192
    vocab_size: int = 6561
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    #: The hidden width of the lookahead convolution (the yaml's ``pre_lookahead_layer.channels``).
    pre_lookahead_channels: int = 1024
    cfm_params: CFMParams = field(default_factory=CFMParams)


def match_prompt_lengths(
    prompt_tokens: torch.Tensor, prompt_mel: torch.Tensor, token_mel_ratio: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Trim a prompt's tokens ``[T]`` and mel ``[M, 80]`` to ``n`` tokens and ``ratio·n`` frames, ``n`` the most
    both cover, as upstream's frontend does before the flow (which needs the mel to be exactly ``ratio·T``)."""
    tokens = min(prompt_mel.shape[0] // token_mel_ratio, prompt_tokens.shape[0])
    return prompt_tokens[:tokens], prompt_mel[: tokens * token_mel_ratio]


def join_rows(
    first: torch.Tensor, first_lengths: torch.Tensor, second: torch.Tensor, second_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's valid ``first`` then its valid ``second`` (``[B, *]`` right-padded), right-padded with zeros."""
    lengths = first_lengths + second_lengths
    positions = torch.arange(int(lengths.max()), device=first.device)[None, :]
    in_first = positions < first_lengths[:, None]
    # Index into cat([first, second]): the first part in place, the second shifted left over first's padding.
    index = torch.where(in_first, positions, positions - first_lengths[:, None] + first.size(1))
    both = torch.cat([first, second], dim=1)
    joined = both.gather(1, index.clamp(max=both.size(1) - 1))
    return joined.masked_fill(positions >= lengths[:, None], 0), lengths


class _TokenFlow(nn.Module, ABC):
    """What both generations share: token and speaker embeddings, the solver, and the batched inference."""

    def __init__(
        self,
        *,
        vocab_size: int,
        input_size: int,
        spk_embed_dim: int,
        output_size: int,
        pre_lookahead_len: int,
        token_mel_ratio: int,
        estimator: nn.Module,
        cfm_params: CFMParams,
    ):
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.token_mel_ratio = token_mel_ratio
        self.input_embedding = nn.Embedding(vocab_size, input_size)
        self.spk_embed_affine_layer = nn.Linear(spk_embed_dim, output_size)
        self.decoder = ConditionalFlowMatching(estimator, cfm_params, mel_bins=output_size)
        #: What runs ``decoder``'s solver in its place, with the same arguments (a runtime's CUDA graphs), or None.
        self.solver: Callable[..., torch.Tensor] | None = None

    @abstractmethod
    def _mu(
        self, embedded: torch.Tensor, lengths: torch.Tensor, *, right_context: int, streaming: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``mu`` ``[B, M, mel]`` and each row's frames, from embedded rows whose last ``right_context`` tokens
        are lookahead only."""

    @torch.inference_mode()
    def inference(
        self,
        tokens: torch.Tensor,
        token_lengths: torch.Tensor,
        prompt_tokens: torch.Tensor,
        prompt_token_lengths: torch.Tensor,
        prompt_mels: torch.Tensor,
        prompt_mel_lengths: torch.Tensor,
        embeddings: torch.Tensor,
        *,
        streaming: bool,
        finalize: bool,
    ) -> list[torch.Tensor]:
        """Each row's target mel ``[mel, frames]`` in float32, ``frames = ratio·(token_length - lookahead)``.

        :param tokens: speech tokens to speak ``[B, T]`` (int), right-padded; ``token_lengths`` ``[B]``.
        :param prompt_tokens: the prompt's speech tokens ``[B, P]``, right-padded; ``prompt_token_lengths`` ``[B]``.
        :param prompt_mels: the prompt's mel ``[B, M_p, mel]``, right-padded; ``prompt_mel_lengths`` ``[B]`` must be
            ``ratio·prompt_token_lengths`` (``match_prompt_lengths`` trims a prompt to that).
        :param embeddings: speaker embeddings ``[B, spk_embed_dim]`` (normalised here).
        :param streaming: chunk-causal attention (in the encoder and the estimator).
        :param finalize: False while streaming: each row's last ``pre_lookahead_len`` tokens are lookahead only.
        """
        right_context = 0 if finalize else self.pre_lookahead_len
        self._check_lengths(token_lengths, prompt_token_lengths, prompt_mel_lengths, right_context)
        sequence, lengths = join_rows(prompt_tokens, prompt_token_lengths, tokens, token_lengths)
        valid = padding_mask(lengths, sequence.size(1))[:, :, None]
        embedded = self.input_embedding(sequence.clamp(min=0))
        embedded = embedded * valid.to(embedded.dtype)
        speakers = self.spk_embed_affine_layer(F.normalize(embeddings, dim=1))
        with encoder_kernels(rows=len(embedded)):
            mu, mel_lengths = self._mu(embedded, lengths, right_context=right_context, streaming=streaming)
        frames = mu.size(1)
        prompt_mels = prompt_mels[:, :frames]
        in_prompt = padding_mask(prompt_mel_lengths, prompt_mels.size(1))[:, :, None]
        cond = torch.zeros_like(mu)
        cond[:, : prompt_mels.size(1)] = prompt_mels * in_prompt.to(prompt_mels.dtype)
        mask = padding_mask(mel_lengths, frames)[:, None, :].to(mu.dtype)
        solve = self.solver or self.decoder
        mel = solve(mu.transpose(1, 2).contiguous(), mask, speakers, cond.transpose(1, 2), streaming=streaming)
        starts, ends = prompt_mel_lengths.tolist(), mel_lengths.tolist()
        return [mel[row, :, start:end] for row, (start, end) in enumerate(zip(starts, ends, strict=True))]

    def _check_lengths(
        self,
        token_lengths: torch.Tensor,
        prompt_token_lengths: torch.Tensor,
        prompt_mel_lengths: torch.Tensor,
        right_context: int,
    ) -> None:
        if bool((prompt_mel_lengths != prompt_token_lengths * self.token_mel_ratio).any()):
            raise ValueError(
                f"prompt mel frames {prompt_mel_lengths.tolist()} are not {self.token_mel_ratio}× the prompt tokens "
                f"{prompt_token_lengths.tolist()}: trim each prompt with match_prompt_lengths"
            )
        if bool((token_lengths < right_context).any()):
            raise ValueError(
                f"a call with finalize=False needs at least {right_context} tokens per row (the lookahead); got "
                f"{token_lengths.tolist()}: send more tokens, or finalize"
            )
        if bool((prompt_token_lengths + token_lengths <= right_context).any()):
            raise ValueError("a row has no token to speak and no prompt: drop the empty request")


class CosyVoice2Flow(_TokenFlow):
    """CosyVoice2: ``input_embedding``, ``spk_embed_affine_layer``, ``encoder``, ``encoder_proj``, ``decoder``."""

    def __init__(self, config: CosyVoice2FlowConfig, estimator: nn.Module):
        if config.encoder.input_size != config.input_size:
            raise ValueError(
                f"the encoder's input_size {config.encoder.input_size} differs from the token embedding's "
                f"{config.input_size}: set both to the same size"
            )
        super().__init__(
            vocab_size=config.vocab_size,
            input_size=config.input_size,
            spk_embed_dim=config.spk_embed_dim,
            output_size=config.output_size,
            pre_lookahead_len=config.pre_lookahead_len,
            token_mel_ratio=UPSAMPLE_STRIDE,
            estimator=estimator,
            cfm_params=config.cfm_params,
        )
        self.config = config
        self.encoder = UpsampleConformerEncoder(config.encoder, config.pre_lookahead_len)
        self.encoder_proj = nn.Linear(config.encoder.output_size, config.output_size)

    def _mu(
        self, embedded: torch.Tensor, lengths: torch.Tensor, *, right_context: int, streaming: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, mel_lengths = self.encoder(embedded, lengths, right_context=right_context, streaming=streaming)
        return self.encoder_proj(hidden), mel_lengths


class CosyVoice3Flow(_TokenFlow):
    """CosyVoice3: ``input_embedding``, ``spk_embed_affine_layer``, ``pre_lookahead_layer``, ``decoder``."""

    def __init__(self, config: CosyVoice3FlowConfig, estimator: nn.Module):
        if config.input_size != config.output_size:
            raise ValueError(
                f"CosyVoice3's token embedding ({config.input_size}) is mu itself and must have the mel's "
                f"{config.output_size} channels: set input_size to output_size"
            )
        super().__init__(
            vocab_size=config.vocab_size,
            input_size=config.input_size,
            spk_embed_dim=config.spk_embed_dim,
            output_size=config.output_size,
            pre_lookahead_len=config.pre_lookahead_len,
            token_mel_ratio=config.token_mel_ratio,
            estimator=estimator,
            cfm_params=config.cfm_params,
        )
        self.config = config
        self.pre_lookahead_layer = PreLookaheadLayer(
            config.input_size, config.pre_lookahead_channels, config.pre_lookahead_len
        )

    def _mu(
        self, embedded: torch.Tensor, lengths: torch.Tensor, *, right_context: int, streaming: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.pre_lookahead_layer(embedded, lengths)
        lengths = lengths - right_context
        hidden = hidden[:, : int(lengths.max())]
        return hidden.repeat_interleave(self.token_mel_ratio, dim=1), lengths * self.token_mel_ratio
