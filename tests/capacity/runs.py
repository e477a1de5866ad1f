"""Measured curves for the planner's tests: closed-form ones built in memory, and perf run folders written by perf's
own report writer from hand-made records."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trtdeploy.capacity import MeasuredLevel, ReplicaCurve
from trtdeploy.perf.metrics import LevelStats, request_metrics
from trtdeploy.perf.report import ReportWriter
from trtdeploy.perf.slo import Slo

from ..perf.helpers import level, record


def exponential_curve(slo: str, *, slots: int, mean_s: float = 1.0, samples: int = 4096) -> ReplicaCurve:
    """A replica of ``slots`` parallel servers with exponential service times independent of how many are busy (an
    M/M/c queue once fed Poisson arrivals): each closed-loop level 1..slots serves ``k / mean_s`` requests/s, its
    requests' latencies the exponential distribution's quantiles."""
    quantiles = -mean_s * np.log(1 - (np.arange(samples) + 0.5) / samples)
    rows = [{"e2e_ms": value * 1e3, "error": None} for value in quantiles]
    levels = [MeasuredLevel(k, None, k / mean_s, rows) for k in range(1, slots + 1)]
    return ReplicaCurve.from_levels("mmc", Slo.parse(slo), levels, stream=False, gpus=1)


def busier_is_slower_curve(slo: str, concurrencies: Sequence[int] = (1, 2, 4, 8, 16)) -> ReplicaCurve:
    """A replica whose requests take longer the more it serves at once (gamma latencies, the mean growing from
    1 s alone to 2 s at 16), as continuous batching behaves."""
    rng = np.random.default_rng(7)
    levels = []
    for c in concurrencies:
        mean_s = 1.0 + (c - 1) / 15
        e2e = rng.gamma(4, mean_s / 4, 2000)
        rows = [{"e2e_ms": x * 1e3, "ttft_ms": 40 + 10 * c, "itl_ms": 5.0, "error": None} for x in e2e]
        levels.append(MeasuredLevel(c, None, c / mean_s, rows))
    return ReplicaCurve.from_levels("batching", Slo.parse(slo), levels, gpus=1)


def write_llm_run(
    out: Path, latencies: dict[int, Sequence[float]], *, build: dict | None = None, slo: str | None = None
) -> Path:
    """A streaming LLM perf run written by perf's report writer: per closed-loop concurrency, its requests' E2E
    latencies in ms (each sent when the one before it in its slot ended; TTFT a tenth of its E2E)."""
    writer = ReportWriter(out, plots=False)
    header = {"model": "qwen_llm", "family": "llm", "stream": True, "protocol": "grpc", "build": build}
    writer.started({**header, "slo": Slo.parse(slo).to_dict() if slo else None})
    for index, (concurrency, e2e) in enumerate(sorted(latencies.items())):
        lv = level(concurrency=concurrency, num_requests=len(e2e), index=index)
        stats = LevelStats(lv, stream=True, family="llm", slo=Slo.parse(slo) if slo else None)
        ends = [0.0] * concurrency
        for seq, took in enumerate(e2e):
            slot = seq % concurrency
            send, ends[slot] = ends[slot], ends[slot] + took
            chunks = [(send + took / 10, 1), (send + took, 9)]
            rec = record(send, send + took, chunks, seq=seq, level=index)
            metrics = request_metrics(rec, stream=True, family="llm")
            stats.add(rec, metrics)
            writer.record(rec, lv, metrics)
        writer.level_done(stats.summary())
    writer.finish()
    return out


def mmc_response_quantile(arrival_rate: float, slots: int, mean_s: float, q: float) -> float:
    """The ``q`` quantile of the response time (wait + service) of an M/M/c queue, from Erlang C: a request waits
    with probability C, then an exponential time of rate c·mu - lambda."""
    mu = 1 / mean_s
    if arrival_rate >= slots * mu:
        return math.inf
    erlang_c = _erlang_c(arrival_rate / mu, slots)
    drain = slots * mu - arrival_rate

    def cdf(t: float) -> float:
        served = 1 - math.exp(-mu * t)
        if abs(drain - mu) < 1e-12:
            waited = 1 - math.exp(-mu * t) * (1 + mu * t)
        else:
            waited = 1 - (drain * math.exp(-mu * t) - mu * math.exp(-drain * t)) / (drain - mu)
        return (1 - erlang_c) * served + erlang_c * waited

    low, high = 0.0, 1.0
    while cdf(high) < q:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < q else (low, middle)
    return (low + high) / 2


def mmc_mean_in_system(arrival_rate: float, slots: int, mean_s: float) -> float:
    """The mean number of requests in an M/M/c queue (waiting or in service): C·rho/(1 - rho) + lambda/mu."""
    load = arrival_rate * mean_s
    rho = load / slots
    return _erlang_c(load, slots) * rho / (1 - rho) + load


def _erlang_c(load: float, slots: int) -> float:
    """The probability that a request of an M/M/c queue at offered load ``load`` (lambda/mu) waits."""
    tail = load**slots / math.factorial(slots) / (1 - load / slots)
    return tail / (sum(load**k / math.factorial(k) for k in range(slots)) + tail)
