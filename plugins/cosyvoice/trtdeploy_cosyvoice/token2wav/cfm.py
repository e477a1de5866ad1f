"""The conditional flow-matching solver shared by CosyVoice2 and CosyVoice3 (the checkpoint's ``decoder.*``).

It integrates the estimator's velocity from fixed noise at t = 0 to the mel at t = 1 in Euler steps on a cosine
schedule, with classifier-free guidance: every step runs the estimator on the conditioned rows and on copies with
mu, the speaker and the prompt mel zeroed, and extrapolates ``(1 + rate)·v_cond - rate·v_uncond``.

The noise is a fixed table, the same for every call and row (upstream seeds its generator with 0 at construction),
so the flow is deterministic and a row's output does not depend on what it is batched with. It is drawn from a
generator of its own: building the solver leaves the global random state alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

NOISE_SEED = 0
#: 300 s of 50 Hz mel frames: the longest prompt + target the solver can produce.
NOISE_FRAMES = 15000


@dataclass(frozen=True)
class CFMParams:
    """The yaml's ``cfm_params`` that inference reads (solver euler, t_scheduler cosine), and the step count."""

    inference_cfg_rate: float = 0.7
    #: Euler steps (upstream's flow passes 10; not a yaml value).
    n_timesteps: int = 10


def fixed_noise(mel_bins: int) -> torch.Tensor:
    """``[1, mel_bins, NOISE_FRAMES]`` equal to ``torch.manual_seed(0); torch.randn(...)``, without reseeding."""
    generator = torch.Generator(device="cpu").manual_seed(NOISE_SEED)
    return torch.randn(1, mel_bins, NOISE_FRAMES, generator=generator, device="cpu")


class ConditionalFlowMatching(nn.Module):
    """Holds the estimator (keys ``estimator.*``) and solves the flow for a batch of rows.

    The estimator is called as ``estimator(x, mask, mu, t, spks, cond, streaming=...)`` with ``x``, ``mu``,
    ``cond`` [2B, mel, M], ``mask`` [2B, 1, M], ``t`` [2B], ``spks`` [2B, mel] and returns the velocity like ``x``.
    """

    def __init__(self, estimator: nn.Module, params: CFMParams | None = None, *, mel_bins: int = 80):
        super().__init__()
        self.estimator = estimator
        self.params = params or CFMParams()
        # Not in the checkpoint; a buffer only so that it follows the module to its device and dtype.
        self.register_buffer("noise", fixed_noise(mel_bins), persistent=False)

    @torch.inference_mode()
    def forward(
        self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor, *, streaming: bool
    ) -> torch.Tensor:
        """The mel ``[B, mel, M]`` in float32 (upstream's cast) for ``mu``, ``cond`` [B, mel, M], ``mask`` [B, 1, M],
        ``spks`` [B, mel]."""
        batch, _, frames = mu.shape
        if frames > self.noise.size(2):
            raise ValueError(
                f"{frames} mel frames exceed the flow's limit of {self.noise.size(2)} (300 s with the prompt): "
                "send shorter requests"
            )
        x = self.noise[:, :, :frames].to(device=mu.device, dtype=mu.dtype).expand(batch, -1, -1)
        steps = self.params.n_timesteps
        t_span = 1 - torch.cos(torch.linspace(0, 1, steps + 1, device=mu.device, dtype=mu.dtype) * 0.5 * math.pi)
        # Upstream accumulates t (and takes dt against the running t) instead of reading t_span: mirrored exactly,
        # shapes included (dt starts 0-d, then has one element), because the rounding and the dtype promotion of
        # ``dt * v`` follow from them.
        t, dt = t_span[:1], t_span[1] - t_span[0]
        # The estimator runs in the speaker vector's dtype: under autocast mu may be float32 and the engine fp16.
        dtype = spks.dtype
        unconditioned = torch.zeros_like(mu, dtype=dtype)
        mu_in = torch.cat([mu.to(dtype), unconditioned])
        spks_in = torch.cat([spks, torch.zeros_like(spks)])
        cond_in = torch.cat([cond.to(dtype), unconditioned])
        mask_in = torch.cat([mask, mask]).to(dtype)
        rate = self.params.inference_cfg_rate
        for step in range(1, steps + 1):
            x_in = torch.cat([x, x]).to(dtype)
            t_in = t.expand(2 * batch).to(dtype)
            velocity = self.estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming)
            conditioned, free = velocity.split(batch)
            x = x + dt * ((1.0 + rate) * conditioned - rate * free)
            t = t + dt
            if step < steps:
                dt = t_span[step + 1] - t
        return x.float()
