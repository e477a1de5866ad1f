"""Vectorised token selection with TRT-LLM's sampling semantics, reproducible per request.

Random draws come from a counter-based hash of ``(seed, counter, token id)`` computed on the device, turned into
Gumbel noise: the token with the largest ``logit / temperature + noise`` among those top-k/top-p keep wins. A row's
choice therefore depends only on its own logits, seed and counter, never on the other rows of the batch or on how
the candidates were gathered. Greedy rows (temperature 0, or top_k 0 with top_p 0, or top_k 1) take the argmax.
In fp32 a seeded request therefore gives the same tokens in any batch. In bf16/fp16 the logits themselves can differ
in the last bits between batch shapes (GEMM kernels change with the row count), so a near-tie may go either way.

Which operations a step needs (penalty, ranking width, nucleus) is decided on the host from the slots' settings, a
:class:`SamplingPlan`; the device work then has no host round trip, and a decode step's choice over slots
``[0, batch)`` is replayed as one CUDA graph per (batch, plan) when the model uses graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...contract import SamplingParams

log = logging.getLogger(__name__)

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so that products of 32-bit values never overflow int64.
_MULTIPLIERS = (0x7FEB352D, 0x31848BAB)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) on int64 tensors holding values below 2**32."""
    for multiplier in _MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * multiplier) & _MASK32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Uniform floats in (0, 1), one per ``token_ids [rows, n]`` entry, a pure function of (seed, counter, id)."""
    seeds = seeds.to(torch.int64)
    key = _mix((seeds & _MASK32) ^ _mix((seeds >> 32) & _MASK32))
    key = _mix(key ^ _mix(counters.to(torch.int64) & _MASK32))
    bits = _mix(key[:, None] ^ _mix(token_ids.to(torch.int64)))
    return ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def _gumbel(seeds: torch.Tensor, counters: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(uniform_noise(seeds, counters, token_ids)))


def _ranking_width(top_k: int, vocab_size: int) -> int:
    """``top_k`` rounded up to a power of two (fewer plans, hence fewer CUDA graphs), at most the vocabulary."""
    return min(1 << max(top_k - 1, 0).bit_length(), vocab_size)


@dataclass(frozen=True)
class SamplingPlan:
    """What a sampling step over some slots must compute, decided from their settings on the host.

    ``width`` is how many ranked candidates to keep: 0 draws over the whole vocabulary without ranking (plain
    temperature sampling, or every row greedy when ``draws`` is off), the vocabulary size means a full sort.
    """

    penalised: bool
    draws: bool
    width: int
    nucleus: bool

    @classmethod
    def of(cls, params: list[SamplingParams], vocab_size: int) -> SamplingPlan:
        sampling = [p for p in params if not p.greedy]
        penalised = any(p.repetition_penalty != 1.0 for p in params)
        if not sampling or all(p.top_k <= 0 and not p.uses_top_p for p in sampling):
            return cls(penalised, bool(sampling), 0, False)
        if all(p.top_k > 0 for p in sampling):
            width = _ranking_width(max(p.top_k for p in sampling), vocab_size)
        else:
            width = vocab_size
        return cls(penalised, True, width, any(p.uses_top_p for p in sampling))


class SlotSampler:
    """Sampling settings of every cache slot, on the device, and the sampling step over a batch of slots.

    ``capture`` (the model's CUDA graph capture, when it uses graphs) turns each (batch, plan) of the decode step
    into a replayed graph; without it, or when a capture fails, the same operations run eagerly.
    """

    def __init__(
        self,
        max_slots: int,
        vocab_size: int,
        device: torch.device,
        capture: Callable[[Callable[[], torch.Tensor]], tuple[torch.cuda.CUDAGraph, torch.Tensor]] | None = None,
    ):
        self.vocab_size = vocab_size
        self.device = device
        self.params: list[SamplingParams] = [SamplingParams()] * max_slots
        self.temperature = torch.ones(max_slots, device=device)
        self.top_k = torch.zeros(max_slots, dtype=torch.long, device=device)
        self.top_p = torch.ones(max_slots, device=device)
        self.penalty = torch.ones(max_slots, device=device)
        self.seed = torch.zeros(max_slots, dtype=torch.long, device=device)
        self.greedy = torch.ones(max_slots, dtype=torch.bool, device=device)
        #: ``[slots, vocab]`` bool: tokens seen by each slot, allocated when a repetition penalty is first asked.
        self.seen: torch.Tensor | None = None
        self._slot_index = torch.arange(max_slots, device=device)
        self._capture = capture
        self._graphs: dict[tuple[int, SamplingPlan], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @torch.inference_mode()
    def assign(self, slots: list[int], params: list[SamplingParams], prompts: list[list[int]]) -> None:
        """Give slots their requests' settings (and, for repetition penalties, the prompt tokens seen)."""
        for slot, item in zip(slots, params, strict=True):
            self.params[slot] = item
        index = torch.as_tensor(slots, dtype=torch.long, device=self.device)

        def put(buffer: torch.Tensor, values: list) -> None:
            buffer.index_copy_(0, index, torch.as_tensor(values, dtype=buffer.dtype).to(self.device))

        put(self.temperature, [max(p.temperature, 1e-6) for p in params])
        put(self.top_k, [max(p.top_k, 0) for p in params])
        put(self.top_p, [p.top_p if p.uses_top_p else 1.0 for p in params])
        put(self.penalty, [p.repetition_penalty for p in params])
        put(self.seed, [p.seed & 0x7FFFFFFFFFFFFFFF for p in params])
        put(self.greedy, [p.greedy for p in params])
        for slot, item, prompt in zip(slots, params, prompts, strict=True):
            if item.repetition_penalty != 1.0:
                if self.seen is None:
                    self.seen = torch.zeros(len(self.params), self.vocab_size, dtype=torch.bool, device=self.device)
                self.seen[slot] = False
                self.seen[slot, torch.as_tensor(prompt, dtype=torch.long, device=self.device)] = True

    def release(self, slot: int) -> None:
        """Forget a finished sequence's settings (the slot's row is greedy until it is assigned again)."""
        self.params[slot] = SamplingParams()

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, slots: list[int], counters: torch.Tensor) -> torch.Tensor:
        """Pick one token per row of ``logits [rows, vocab]``; row ``i`` belongs to slot ``slots[i]``.

        ``counters`` (device, one per row) feeds the noise: the position of the token whose logits these are,
        which makes a request's draws depend on its own progress only.
        """
        plan = SamplingPlan.of([self.params[slot] for slot in slots], self.vocab_size)
        rows = torch.as_tensor(slots, dtype=torch.long).to(self.device)
        return self._remember(rows, self._choose(logits, rows, counters, plan), plan)

    @torch.inference_mode()
    def sample_decode(self, logits: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
        """:meth:`sample` for a decode step over slots ``[0, len(logits))`` whose ``logits`` and ``counters`` are
        the model's static buffers: replayed as a CUDA graph when the sampler was given ``capture``."""
        batch = len(logits)
        plan = SamplingPlan.of(self.params[:batch], self.vocab_size)
        rows = self._slot_index[:batch]
        entry = self._graphs.get((batch, plan))
        if entry is None and self._capture is not None:
            try:
                entry = self._graphs[(batch, plan)] = self._capture(lambda: self._choose(logits, rows, counters, plan))
            except RuntimeError:
                log.exception("CUDA graph capture of the sampling step failed: sampling eagerly from now on")
                self._capture = None
        if entry is None:
            chosen = self._choose(logits, rows, counters, plan)
        else:
            graph, chosen = entry
            graph.replay()
        return self._remember(rows, chosen, plan)

    def _remember(self, rows: torch.Tensor, chosen: torch.Tensor, plan: SamplingPlan) -> torch.Tensor:
        """Record the chosen tokens for the repetition penalty (outside :meth:`_choose`: a capture's warm-up
        runs must not change what the replay sees)."""
        if plan.penalised:
            self.seen.index_put_((rows, chosen), torch.ones((), dtype=torch.bool, device=self.device))
        return chosen

    def _choose(self, logits: torch.Tensor, rows: torch.Tensor, counters: torch.Tensor, plan: SamplingPlan):
        """The device work of a sampling step: no host synchronisation and no side effect, so it can be captured."""
        if not plan.penalised and not plan.draws:
            return logits.argmax(-1)
        logits = logits.float()
        if plan.penalised:
            logits = self._penalise(logits, rows)
        chosen = logits.argmax(-1)
        if plan.draws:
            chosen = torch.where(self.greedy[rows], chosen, self._draw(logits, rows, counters, plan))
        return chosen

    def _penalise(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        penalty = self.penalty[rows][:, None]
        scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
        return torch.where(self.seen[rows], scaled, logits)

    def _draw(self, logits: torch.Tensor, rows: torch.Tensor, counters: torch.Tensor, plan: SamplingPlan):
        logits = logits / self.temperature[rows][:, None]
        seeds = self.seed[rows]
        if plan.width == 0:
            # Plain temperature sampling: no candidate ranking needed.
            token_ids = torch.arange(self.vocab_size, device=self.device).expand_as(logits)
            return (logits + _gumbel(seeds, counters, token_ids)).argmax(-1)
        if plan.width < self.vocab_size:
            values, token_ids = logits.topk(plan.width, -1)
        else:
            values, token_ids = logits.sort(-1, descending=True)
        ranks = torch.arange(plan.width, device=self.device)
        top_k = self.top_k[rows]
        keep = (ranks[None, :] < top_k[:, None]) | (top_k[:, None] == 0)
        values = values.masked_fill(~keep, float("-inf"))
        if plan.nucleus:
            probs = torch.softmax(values, -1)
            before = probs.cumsum(-1) - probs
            values = values.masked_fill(before >= self.top_p[rows][:, None], float("-inf"))
        winner = (values + _gumbel(seeds, counters, token_ids)).argmax(-1, keepdim=True)
        return token_ids.gather(-1, winner).squeeze(-1)
