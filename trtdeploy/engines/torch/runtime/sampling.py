"""Vectorised token selection with TRT-LLM's sampling semantics, reproducible per request.

Random draws come from a counter-based hash of ``(seed, counter, token id)`` computed on the device, turned into
Gumbel noise: the token with the largest ``logit / temperature + noise`` among those top-k/top-p keep wins. A row's
choice therefore depends only on its own logits, seed and counter, never on the other rows of the batch or on how
the candidates were gathered. Greedy rows (temperature 0, or top_k 0 with top_p 0, or top_k 1) take the argmax.
In fp32 a seeded request therefore gives the same tokens in any batch. In bf16/fp16 the logits themselves can differ
in the last bits between batch shapes (GEMM kernels change with the row count), so a near-tie may go either way.

Which operations a step needs (bias, penalties, banned tokens, ranking width, nucleus, log probabilities) is decided
on the host from the slots' settings, a :class:`SamplingPlan`; the device work then has no host round trip, and a
decode step's choice over slots ``[0, batch)`` is replayed as one CUDA graph per (batch, plan) when the model uses
graphs.

A request whose embedding bias is ``-inf`` outside a part of the vocabulary (a speech model's tokens after the text
ones) can never choose a token outside it. When every running slot's bias leaves such a part, a decode step computes
only the columns of their union (:meth:`SlotSampler.columns`): the LM head reads only those rows of its weights and
the sampling works on those columns, choosing what it would choose over the whole vocabulary.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...contract import SamplingParams
from .host import to_device
from .kernels import gumbel_noise

log = logging.getLogger(__name__)

#: A bias's columns are widened to multiples of this: requests whose biases differ a little (a few more tokens
#: banned) share the CUDA graphs of one column window, and the LM head's rows stay aligned.
COLUMN_GRAIN = 1024


def bias_columns(bias: np.ndarray, vocab_size: int) -> tuple[int, int] | None:
    """The columns ``(first, end)`` outside which ``bias`` (``[<= vocab]``, zeros beyond its end) is ``-inf``,
    widened to :data:`COLUMN_GRAIN`; None when that is the whole vocabulary (or nothing: every token banned)."""
    kept = np.flatnonzero(~np.isneginf(bias))
    if not len(kept):
        return None
    end = vocab_size if len(bias) < vocab_size else int(kept[-1]) + 1
    first = int(kept[0]) // COLUMN_GRAIN * COLUMN_GRAIN
    end = min(-(-end // COLUMN_GRAIN) * COLUMN_GRAIN, vocab_size)
    return None if (first, end) == (0, vocab_size) else (first, end)


def _ranking_width(top_k: int, vocab_size: int) -> int:
    """``top_k`` rounded up to a power of two (fewer plans, hence fewer CUDA graphs), at most the vocabulary."""
    return min(1 << max(top_k - 1, 0).bit_length(), vocab_size)


@dataclass(frozen=True)
class SamplingPlan:
    """What a sampling step over some slots must compute, decided from their settings on the host.

    ``columns``: the logits are those columns ``(first, end)`` of the vocabulary only (None: all of it).
    ``width`` is how many ranked candidates to keep: 0 draws over the columns without ranking (plain temperature
    sampling, or every row greedy when ``draws`` is off), their count means a full sort. ``biased``: some slot has
    an embedding bias; ``masked``: some slot has banned tokens (bad words, or end tokens before its minimum length);
    ``log_probs``: some sampled slot wants the chosen tokens' log probabilities.
    """

    penalised: bool
    draws: bool
    width: int
    nucleus: bool
    #: Some slot has a presence or frequency penalty (the repetition penalty alone needs neither term).
    additive: bool = False
    biased: bool = False
    masked: bool = False
    log_probs: bool = False
    columns: tuple[int, int] | None = None

    @classmethod
    def of(
        cls,
        params: list[SamplingParams],
        vocab_size: int,
        *,
        biased: bool = False,
        masked: bool = False,
        log_probs: bool = False,
        columns: tuple[int, int] | None = None,
    ) -> SamplingPlan:
        sampling = [p for p in params if not p.greedy]
        flags = {
            "penalised": any(p.penalised for p in params),
            "additive": any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params),
            "draws": bool(sampling),
            "biased": biased,
            "masked": masked,
            "log_probs": log_probs and bool(sampling),
            "columns": columns,
        }
        if columns is not None:
            vocab_size = columns[1] - columns[0]
        if not sampling or all(p.top_k <= 0 and not p.uses_top_p for p in sampling):
            return cls(width=0, nucleus=False, **flags)
        if all(p.top_k > 0 for p in sampling):
            width = _ranking_width(max(p.top_k for p in sampling), vocab_size)
        else:
            width = vocab_size
        return cls(width=width, nucleus=any(p.uses_top_p for p in sampling), **flags)

    @property
    def argmax_only(self) -> bool:
        return not (self.penalised or self.draws or self.biased or self.masked)

    def span(self, vocab_size: int) -> tuple[int, int]:
        """The columns the logits hold."""
        return self.columns or (0, vocab_size)


class SlotSampler:
    """Sampling settings of every cache slot, on the device, and the sampling step over a batch of slots.

    The step follows TRT-LLM's order: embedding bias, temperature, penalties, banned tokens masked, then the argmax
    (greedy rows) or a top-k/top-p draw. A sampled token's log probability is taken in the distribution it was
    drawn from (the kept candidates, renormalised); a greedy token's is 0, as TRT-LLM reports them.

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
        self.max_slots = max_slots
        self.vocab_size = vocab_size
        self.device = device
        self.params: list[SamplingParams] = [SamplingParams()] * max_slots
        self.temperature = torch.ones(max_slots, device=device)
        self.top_k = torch.zeros(max_slots, dtype=torch.long, device=device)
        self.top_p = torch.ones(max_slots, device=device)
        self.repetition = torch.ones(max_slots, device=device)
        self.presence = torch.zeros(max_slots, device=device)
        self.frequency = torch.zeros(max_slots, device=device)
        self.seed = torch.zeros(max_slots, dtype=torch.long, device=device)
        self.greedy = torch.ones(max_slots, dtype=torch.bool, device=device)
        #: The log probability of each slot's last chosen token (written by steps whose plan asks for them).
        self.chosen_log_probs = torch.zeros(max_slots, device=device)
        #: ``[slots, vocab]``, allocated when first needed: occurrences of each token in a slot's prompt and output
        #: (penalties), embedding biases, banned tokens.
        self.counts: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.banned: torch.Tensor | None = None
        self._biased: set[int] = set()
        #: The columns of each biased slot whose bias leaves only a part of the vocabulary (see bias_columns).
        self._columns: dict[int, tuple[int, int] | None] = {}
        self._bans: dict[int, frozenset[int]] = {}
        self._log_probs: set[int] = set()
        self._slot_index = torch.arange(max_slots, device=device)
        self._capture = capture
        self._graphs: dict[tuple[int, SamplingPlan], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _table(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(self.max_slots, self.vocab_size, dtype=dtype, device=self.device)

    @torch.inference_mode()
    def assign(
        self,
        slots: list[int],
        params: list[SamplingParams],
        prompts: list[list[int]],
        biases: list[np.ndarray | None] | None = None,
        log_probs: list[bool] | None = None,
    ) -> None:
        """Give slots their requests' settings: sampling parameters, the prompt tokens the penalties count, an
        embedding bias (``[<= vocab]``, or None) and whether the chosen tokens' log probabilities are wanted."""
        for slot, item in zip(slots, params, strict=True):
            self.params[slot] = item
        index = to_device(slots, self.device, torch.long)

        def put(buffer: torch.Tensor, values: list) -> None:
            buffer.index_copy_(0, index, to_device(values, self.device, buffer.dtype))

        put(self.temperature, [max(p.temperature, 1e-6) for p in params])
        put(self.top_k, [max(p.top_k, 0) for p in params])
        put(self.top_p, [p.top_p if p.uses_top_p else 1.0 for p in params])
        put(self.repetition, [p.repetition_penalty for p in params])
        put(self.presence, [p.presence_penalty for p in params])
        put(self.frequency, [p.frequency_penalty for p in params])
        put(self.seed, [p.seed & 0x7FFFFFFFFFFFFFFF for p in params])
        put(self.greedy, [p.greedy for p in params])
        for position, (slot, item, prompt) in enumerate(zip(slots, params, prompts, strict=True)):
            if item.penalised:
                if self.counts is None:
                    self.counts = self._table(torch.int32)
                ids = to_device(prompt, self.device, torch.long)
                self.counts[slot] = torch.bincount(ids, minlength=self.vocab_size).to(torch.int32)
            bias = None if biases is None else biases[position]
            self._forget_bias(slot)
            if bias is not None:
                if self.bias is None:
                    self.bias = self._table(torch.float32)
                self.bias[slot, : len(bias)] = to_device(bias, self.device, torch.float32)
                self._biased.add(slot)
                self._columns[slot] = bias_columns(bias, self.vocab_size)
            if log_probs is not None and log_probs[position]:
                self._log_probs.add(slot)

    @torch.inference_mode()
    def set_bans(self, slot: int, tokens: frozenset[int]) -> None:
        """Ban ``tokens`` from the slot's next choices (replacing its earlier bans)."""
        old = self._bans.get(slot, frozenset())
        if tokens == old:
            return
        if self.banned is None:
            self.banned = self._table(torch.bool)
        if old:
            self.banned[slot, to_device(sorted(old), self.device, torch.long)] = False
        if tokens:
            self.banned[slot, to_device(sorted(tokens), self.device, torch.long)] = True
            self._bans[slot] = tokens
        else:
            del self._bans[slot]

    @torch.inference_mode()
    def release(self, slot: int) -> None:
        """Forget a finished sequence's settings (the slot's row is greedy until it is assigned again)."""
        self.params[slot] = SamplingParams()
        self.set_bans(slot, frozenset())
        self._forget_bias(slot)
        self._log_probs.discard(slot)

    def _forget_bias(self, slot: int) -> None:
        """Zero the slot's bias row: a biased step adds every row of its slots, so a row must be zero unless its
        present request brought a bias."""
        if slot in self._biased:
            self.bias[slot].zero_()
            self._biased.discard(slot)
            del self._columns[slot]

    def log_probs_of(self, slots: list[int]) -> list[float]:
        """The log probabilities of the slots' last chosen tokens (0 for a greedy slot)."""
        values = self.chosen_log_probs[torch.as_tensor(slots, device=self.device)].tolist()
        return [0.0 if self.params[slot].greedy else value for slot, value in zip(slots, values, strict=True)]

    def columns(self, slots: list[int]) -> tuple[int, int] | None:
        """The columns a step over ``slots`` needs: the union of their biases' (every other column is ``-inf`` for
        each of them), or None when one of them may choose any token."""
        if not self._columns:  # the common case: no slot has a bias
            return None
        spans = [self._columns.get(slot) for slot in slots]
        if not spans or None in spans:
            return None
        union = min(first for first, _ in spans), max(end for _, end in spans)
        return None if union == (0, self.vocab_size) else union

    def _plan(self, slots: list[int] | range, columns: tuple[int, int] | None = None) -> SamplingPlan:
        params = [self.params[slot] for slot in slots]
        if not (self._biased or self._bans or self._log_probs):  # the common case: no slot asks for any of them
            return SamplingPlan.of(params, self.vocab_size, columns=columns)
        chosen = set(slots)
        return SamplingPlan.of(
            params,
            self.vocab_size,
            biased=not self._biased.isdisjoint(chosen),
            masked=not chosen.isdisjoint(self._bans),
            log_probs=not self._log_probs.isdisjoint(chosen),
            columns=columns,
        )

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, slots: list[int], counters: torch.Tensor) -> torch.Tensor:
        """Pick one token per row of ``logits [rows, vocab]``; row ``i`` belongs to slot ``slots[i]``.

        ``counters`` (device, one per row) feeds the noise: the position of the token whose logits these are,
        which makes a request's draws depend on its own progress only.
        """
        plan = self._plan(slots)
        rows = to_device(slots, self.device, torch.long)
        return self._remember(rows, self._choose(logits, rows, counters, plan), plan)

    @torch.inference_mode()
    def sample_decode(
        self, logits: torch.Tensor, counters: torch.Tensor, columns: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """:meth:`sample` for a decode step over slots ``[0, len(logits))`` whose ``logits`` and ``counters`` are
        the model's static buffers: replayed as a CUDA graph when the sampler was given ``capture``. With
        ``columns`` (from :meth:`columns` over the running slots), ``logits`` hold only those columns."""
        batch = len(logits)
        plan = self._plan(range(batch), columns)
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
        """Count the chosen tokens for the penalties (outside :meth:`_choose`: a capture's warm-up runs must not
        change what the replay sees)."""
        if plan.penalised:
            self.counts.index_put_((rows, chosen), torch.ones((), dtype=torch.int32, device=self.device), True)
        return chosen

    def _choose(self, logits: torch.Tensor, rows: torch.Tensor, counters: torch.Tensor, plan: SamplingPlan):
        """The device work of a sampling step: no host synchronisation, and no side effect but the chosen tokens'
        log probabilities, so it can be captured."""
        first, end = plan.span(self.vocab_size)
        if plan.argmax_only:
            return logits.argmax(-1) + first
        logits = logits.float()
        if plan.biased:
            logits = logits + self.bias[rows, first:end]
        if plan.draws or plan.penalised:
            logits = logits / self.temperature[rows][:, None]
        if plan.penalised:
            logits = self._penalise(logits, rows, first, end, plan.additive)
        if plan.masked:
            logits = logits.masked_fill(self.banned[rows, first:end], float("-inf"))
        chosen = logits.argmax(-1) + first
        if plan.draws:
            drawn, log_probs = self._draw(logits, rows, counters, plan)
            greedy = self.greedy[rows]
            chosen = torch.where(greedy, chosen, drawn)
            if plan.log_probs:
                self.chosen_log_probs.index_copy_(0, rows, log_probs.masked_fill(greedy, 0.0))
        return chosen

    def _penalise(self, logits: torch.Tensor, rows: torch.Tensor, first: int, end: int, additive: bool) -> torch.Tensor:
        counts = self.counts[rows, first:end]
        seen = counts > 0
        repetition = self.repetition[rows][:, None]
        logits = torch.where(seen, torch.where(logits < 0, logits * repetition, logits / repetition), logits)
        if not additive:
            return logits
        presence = torch.where(seen, self.presence[rows][:, None], 0.0)
        return logits - presence - self.frequency[rows][:, None] * counts

    def _draw(self, logits: torch.Tensor, rows: torch.Tensor, counters: torch.Tensor, plan: SamplingPlan):
        """A draw per row among its kept candidates, and the drawn token's log probability among them."""
        seeds = self.seed[rows]
        first, end = plan.span(self.vocab_size)
        if plan.width == 0:
            # Plain temperature sampling: no candidate ranking needed.
            token_ids = torch.arange(first, end, device=self.device).expand_as(logits)
            winner = (logits + gumbel_noise(seeds, counters, token_ids)).argmax(-1, keepdim=True)
            log_probs = torch.log_softmax(logits, -1).gather(-1, winner).squeeze(-1) if plan.log_probs else None
            return winner.squeeze(-1) + first, log_probs
        if plan.width < end - first:
            values, token_ids = logits.topk(plan.width, -1)
        else:
            values, token_ids = logits.sort(-1, descending=True)
        token_ids = token_ids + first
        ranks = torch.arange(plan.width, device=self.device)
        top_k = self.top_k[rows]
        keep = (ranks[None, :] < top_k[:, None]) | (top_k[:, None] == 0)
        values = values.masked_fill(~keep, float("-inf"))
        if plan.nucleus:
            probs = torch.softmax(values, -1)
            before = probs.cumsum(-1) - probs
            values = values.masked_fill(before >= self.top_p[rows][:, None], float("-inf"))
        winner = (values + gumbel_noise(seeds, counters, token_ids)).argmax(-1, keepdim=True)
        log_probs = torch.log_softmax(values, -1).gather(-1, winner).squeeze(-1) if plan.log_probs else None
        return token_ids.gather(-1, winner).squeeze(-1), log_probs
