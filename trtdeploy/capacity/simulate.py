"""A discrete-event simulation of identical replicas behind a load balancer, each replica as its measured curve
says it behaves.

The model: requests arrive at ``rate`` (Poisson, or gamma gaps of a burstiness, as perf's open loop sends them). A
replica serves up to ``slots`` requests at once; a request the balancer sends it when all are taken waits, first
come first served, for the first to end. A request that starts when ``k`` requests are in service (itself
included) takes as long as a request measured at concurrency ``k`` took: one of the measured requests is drawn,
from the level of that concurrency, or from the two levels around it in proportion to how near each is. Its
latencies are then the drawn request's, those measured from the send (TTFT, first chunk, E2E) plus its wait, its
RTF scaled alike, its ITL as measured. A request keeps the pace it started at when others start or end beside it.

Balancing: round-robin sends the i-th request to replica ``i mod n``; random to a replica drawn uniformly
(kube-proxy's iptables mode), which gives each replica Poisson arrivals at ``rate / n``; least-requests to the
replica with the fewest requests in flight (in service or waiting).

Least-requests needs every request in turn, in one loop over a heap of departures. Round-robin and random route
in advance, so their replicas are independent: many replicas are stepped all at once in numpy, a replica's j-th
request at step j.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..perf.loadgen import arrival_gaps
from .curves import ReplicaCurve

BALANCING = ("round-robin", "least-requests", "random")
#: Percentiles reported of every modelled metric.
PERCENTILES = (50, 90, 99)
#: The metrics measured from the request's send: a wait before a slot adds to them.
FROM_SEND = ("ttft_ms", "first_chunk_ms", "first_partial_ms", "e2e_ms")
#: Draws per concurrency in the table a request's measured twin is drawn from.
_TABLE_SIZE = 4096
#: From this many replicas, requests routed in advance are simulated all replicas at once (fewer: in turn).
_VECTORISED_FROM = 16
#: Departure times on the least-requests heap are whole microseconds (for ordering only).
_TICKS_PER_S = 1_000_000


@dataclass(frozen=True)
class Load:
    """The simulated load: its rate (req/s), how long it lasts, how its requests are spaced, the seed."""

    rate: float
    duration_s: float = 3600.0
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0

    def arrivals(self) -> np.ndarray:
        """The requests' arrival times in seconds, within ``duration_s``."""
        count = math.ceil(self.rate * self.duration_s)
        count += 16 + math.ceil(8 * math.sqrt(count / min(1.0, self.burstiness)))
        gaps = arrival_gaps(count, 1 / self.rate, arrival=self.arrival, burstiness=self.burstiness, seed=(self.seed,))
        times = np.cumsum(gaps)
        return times[times <= self.duration_s]


@dataclass(frozen=True)
class Outcome:
    """Each simulated request: its wait before a slot, its drawn measured twin and its replica (arrival order)."""

    arrival_s: np.ndarray
    wait_s: np.ndarray
    twin: np.ndarray
    replica: np.ndarray


def twin_table(curve: ReplicaCurve, slots: int) -> np.ndarray:
    """``table[k]``: measured requests to draw from for a request that starts with ``k`` in service (row 0 unused).

    Each row is a stratified mixture of the two levels around ``k`` (the nearest below, the nearest above), in
    proportion to how near each is; below the lowest level its requests, above the highest its requests."""
    at = np.array([level.concurrency for level in curve.levels])
    table = np.zeros((slots + 1, _TABLE_SIZE), dtype=np.int64)
    for k in range(1, slots + 1):
        above = int(np.searchsorted(at, k))
        if above == 0 or above == len(at) or at[above] == k:
            lower = upper = curve.levels[min(above, len(at) - 1)]
            share = 0.0
        else:
            lower, upper = curve.levels[above - 1], curve.levels[above]
            share = (k - lower.concurrency) / (upper.concurrency - lower.concurrency)
        split = round(_TABLE_SIZE * (1 - share))
        for level, columns in ((lower, slice(0, split)), (upper, slice(split, _TABLE_SIZE))):
            width = columns.stop - columns.start
            if width:
                size = level.stop - level.start
                table[k, columns] = level.start + ((np.arange(width) + 0.5) * size / width).astype(np.int64)
    return table


def simulate(curve: ReplicaCurve, replicas: int, load: Load, balancing: str, slots: int | None = None) -> Outcome:
    """Every request of ``load`` through ``replicas`` replicas of ``curve`` behind ``balancing``, each serving up to
    ``slots`` requests at once (default: the curve's :attr:`~ReplicaCurve.slots`)."""
    slots = slots or curve.slots
    arrivals = load.arrivals()
    rng = np.random.default_rng((load.seed, replicas, BALANCING.index(balancing)))
    draws = rng.integers(0, _TABLE_SIZE, len(arrivals))
    table = twin_table(curve, slots)
    if balancing == "least-requests":
        route = None
    elif balancing == "round-robin":
        route = np.arange(len(arrivals)) % replicas
    else:
        route = rng.integers(0, replicas, len(arrivals))
    if route is None or replicas < _VECTORISED_FROM:
        return _in_turn(arrivals, route, draws, table, curve.service_s, replicas, slots)
    return _fixed_routes(arrivals, route, draws, table, curve.service_s, replicas, slots)


def _fixed_routes(
    arrivals: np.ndarray,
    replica: np.ndarray,
    draws: np.ndarray,
    table: np.ndarray,
    service_s: np.ndarray,
    replicas: int,
    slots: int,
) -> Outcome:
    """Requests routed in advance (``replica``): every replica's queue stepped at once, its j-th request at step j."""
    order = np.argsort(replica, kind="stable")
    counts = np.bincount(replica, minlength=replicas)
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    column = np.arange(len(order)) - np.repeat(firsts, counts)
    steps = int(counts.max()) if len(order) else 0
    due = np.full((replicas, steps), np.inf)
    due[replica[order], column] = arrivals[order]
    drawn = np.zeros((replicas, steps), dtype=np.int64)
    drawn[replica[order], column] = draws[order]
    free_at = np.zeros((replicas, slots))  # when each slot's last request ends
    rows = np.arange(replicas)
    starts = np.empty((replicas, steps))
    twins = np.empty((replicas, steps), dtype=np.int64)
    for step in range(steps):
        arrive = due[:, step]
        slot = free_at.argmin(axis=1)
        start = np.maximum(arrive, free_at[rows, slot])
        in_service = (free_at > start[:, None]).sum(axis=1) + 1
        twin = table[in_service, drawn[:, step]]
        free_at[rows, slot] = np.where(np.isfinite(arrive), start + service_s[twin], free_at[rows, slot])
        starts[:, step], twins[:, step] = start, twin
    start_of = np.empty(len(order))
    twin_of = np.empty(len(order), dtype=np.int64)
    start_of[order] = starts[replica[order], column]
    twin_of[order] = twins[replica[order], column]
    return Outcome(arrivals, start_of - arrivals, twin_of, replica)


def _in_turn(
    arrivals: np.ndarray,
    route: np.ndarray | None,
    draws: np.ndarray,
    table: np.ndarray,
    service_s: np.ndarray,
    replicas: int,
    slots: int,
) -> Outcome:
    """Each request in turn, to its replica in ``route`` or (None) to the one with the fewest in flight. Replicas
    are kept in buckets by their count in flight (the one longest in its bucket first); departures on one heap of
    integer keys (tick × replicas + replica), popped as arrivals pass them."""
    count = len(arrivals)
    times = arrivals.tolist()
    ticks = (np.floor(arrivals * _TICKS_PER_S).astype(np.int64) * replicas + replicas - 1).tolist()
    rows = [row.tolist() for row in table]
    service = service_s.tolist()
    drawn = draws.tolist()
    routes = None if route is None else route.tolist()
    free_at = [[0.0] * slots for _ in range(replicas)]  # per replica, a heap of when its slots free up
    in_flight = [0] * replicas
    buckets: list[dict[int, None]] = [dict.fromkeys(range(replicas))]  # count in flight -> replicas, in order
    fewest = 0
    departures: list[int] = []
    waits = [0.0] * count
    twins = [0] * count
    chosen = [0] * count
    pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
    for i in range(count):
        tick = ticks[i]
        while departures and departures[0] <= tick:
            r = pop(departures) % replicas
            held = in_flight[r]
            del buckets[held][r]
            buckets[held - 1][r] = None
            in_flight[r] = held - 1
            if held - 1 < fewest:
                fewest = held - 1
        if routes is None:
            while not buckets[fewest]:
                fewest += 1
            r = next(iter(buckets[fewest]))
        else:
            r = routes[i]
        held = in_flight[r]
        del buckets[held][r]
        if held + 1 == len(buckets):
            buckets.append({})
        buckets[held + 1][r] = None
        in_flight[r] = held + 1
        slots_of = free_at[r]
        now = times[i]
        start = now if now > slots_of[0] else slots_of[0]
        twin = rows[held + 1 if held < slots else slots][drawn[i]]
        end = start + service[twin]
        replace(slots_of, end)
        push(departures, int(end * _TICKS_PER_S) * replicas + r)
        waits[i], twins[i], chosen[i] = start - now, twin, r
    return Outcome(arrivals, np.asarray(waits), np.asarray(twins, dtype=np.int64), np.asarray(chosen))


def latencies(curve: ReplicaCurve, outcome: Outcome) -> dict[str, np.ndarray]:
    """Every simulated request's metrics: its twin's, those from the send plus its wait, its RTF scaled by the
    wait, its ITL as measured (NaN where the twin has none)."""
    wait_ms = outcome.wait_s * 1e3
    values: dict[str, np.ndarray] = {}
    for metric, column in curve.samples.items():
        drawn = column[outcome.twin]
        if metric in FROM_SEND:
            values[metric] = drawn + wait_ms
        elif metric == "rtf":
            service = curve.service_s[outcome.twin]
            with np.errstate(divide="ignore", invalid="ignore"):
                values[metric] = drawn * (service + outcome.wait_s) / service
        else:
            values[metric] = drawn
    return values


def percentiles(values: Mapping[str, np.ndarray]) -> dict[str, dict[str, float | None]]:
    """p50/p90/p99 of each metric over the requests that have it."""
    result: dict[str, dict[str, float | None]] = {}
    for metric, column in values.items():
        present = column[~np.isnan(column)]
        result[metric] = {f"p{p}": float(np.percentile(present, p)) if len(present) else None for p in PERCENTILES}
    return result


def nearest_rank(column: np.ndarray, percentile: float) -> float | None:
    """The value ``percentile`` % of the requests do not exceed, a request without one counting as above any bound
    (nearest rank, as perf reads an SLO's percentile limits); None when those requests reach that rank."""
    rank = max(1, -(-round(percentile * 1000) * len(column) // 100_000))
    ordered = np.sort(np.where(np.isnan(column), np.inf, column))
    value = float(ordered[rank - 1]) if rank <= len(ordered) else math.inf
    return None if math.isinf(value) else value
