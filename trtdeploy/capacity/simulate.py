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
replica with the fewest requests in flight (in service or waiting), of those the one that came to that count last.

Least-requests needs every request in turn, in one loop over a heap of departures. Round-robin and random route
in advance, so their replicas are independent: many replicas are stepped all at once in numpy, a replica's j-th
request at step j.

A simulation given an SLO stops as soon as the SLO is missed for sure: a request's wait is known when it starts,
so whether it misses each limit is too, and once more of the load's requests miss a limit than its percentile (or
the attainment) allows, the rest cannot save it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..perf.loadgen import arrival_gaps
from ..perf.slo import Slo
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
#: A request counts as missing a limit early only when its wait passes the longest it may take by this much (s), so
#: that rounding never stops a simulation that the whole load's latencies would let meet the SLO.
_MISS_MARGIN_S = 1e-6
#: Steps of replicas routed in advance between two looks at the misses, and requests taken in turn.
_STEPS_PER_LOOK = 64
_REQUESTS_PER_LOOK = 16_384


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
    """Each simulated request: its wait before a slot and its drawn measured twin (arrival order)."""

    arrival_s: np.ndarray
    wait_s: np.ndarray
    twin: np.ndarray


@dataclass
class MissBudget:
    """When a simulation may stop: per group of limits (each percentile limit; the per-request limits together),
    the longest wait (s) with which a request of each measured twin still meets them, how many requests of the
    load may miss them with the SLO still met, and how many have so far (one budget per simulation)."""

    longest_wait_s: np.ndarray
    misses_allowed: np.ndarray
    misses: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.misses = np.zeros_like(self.misses_allowed)

    def spent(self, twins: np.ndarray, waits_s: np.ndarray) -> bool:
        """Count these requests' misses; whether some group has now missed more than it may."""
        self.misses += (waits_s[None, :] > self.longest_wait_s[:, twins]).sum(axis=1)
        return bool((self.misses > self.misses_allowed).any())


def miss_budget(curve: ReplicaCurve, slo: Slo, requests: int) -> MissBudget:
    """The :class:`MissBudget` of ``slo`` for a load of ``requests`` requests, held as
    :func:`~trtdeploy.capacity.plan.held_against` holds the whole load: a percentile limit fails once more requests
    miss it than those above its nearest rank, the attainment once the requests meeting every per-request limit can
    no longer reach it. A twin without the metric misses whatever its wait."""
    groups = [((limit,), requests - _rank(limit.percentile or 0, requests)) for limit in slo.percentiles]
    if slo.per_request:
        allowed = requests - math.ceil(slo.attainment * requests)
        while allowed >= 0 and (requests - allowed) / requests < slo.attainment:
            allowed -= 1
        while allowed + 1 <= requests and (requests - allowed - 1) / requests >= slo.attainment:
            allowed += 1
        groups.append((slo.per_request, allowed))
    longest = np.full((len(groups), len(curve.service_s)), np.inf)
    for row, (limits, _) in enumerate(groups):
        for limit in limits:
            longest[row] = np.minimum(longest[row], _longest_wait_s(curve, limit.metric, limit.bound))
    return MissBudget(longest + _MISS_MARGIN_S, np.array([allowed for _, allowed in groups]))


def _longest_wait_s(curve: ReplicaCurve, metric: str, bound: float) -> np.ndarray:
    """Per measured twin, the longest wait (s) with which its ``metric`` stays within ``bound``, as
    :func:`latencies` adds the wait (-inf: never, +inf: always or not known)."""
    drawn = curve.samples[metric]
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric in FROM_SEND:
            longest = (bound - drawn) / 1e3
        elif metric == "rtf":
            longest = curve.service_s * (bound / drawn - 1)
        else:
            longest = np.where(drawn <= bound, np.inf, -np.inf)
    return np.where(np.isnan(drawn), -np.inf, np.where(np.isnan(longest), np.inf, longest))


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


def simulate(
    curve: ReplicaCurve,
    replicas: int,
    load: Load,
    balancing: str,
    slots: int | None = None,
    *,
    stop_past: Slo | None = None,
) -> Outcome | None:
    """Every request of ``load`` through ``replicas`` replicas of ``curve`` behind ``balancing``, each serving up to
    ``slots`` requests at once (default: the curve's :attr:`~ReplicaCurve.slots`). None when ``stop_past`` is given
    and the simulation stopped because the load misses it for sure."""
    slots = slots or curve.slots
    arrivals = load.arrivals()
    budget = miss_budget(curve, stop_past, len(arrivals)) if stop_past is not None and len(arrivals) else None
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
        return _in_turn(arrivals, route, draws, table, curve.service_s, replicas, slots, budget)
    return _fixed_routes(arrivals, route, draws, table, curve.service_s, replicas, slots, budget)


def _fixed_routes(
    arrivals: np.ndarray,
    replica: np.ndarray,
    draws: np.ndarray,
    table: np.ndarray,
    service_s: np.ndarray,
    replicas: int,
    slots: int,
    budget: MissBudget | None,
) -> Outcome | None:
    """Requests routed in advance (``replica``): every replica's queue stepped at once, its j-th request at step j;
    None once ``budget`` is spent."""
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
        if budget is not None and (step % _STEPS_PER_LOOK == _STEPS_PER_LOOK - 1 or step == steps - 1):
            looked = slice(step - step % _STEPS_PER_LOOK, step + 1)
            sent = np.isfinite(due[:, looked])
            if budget.spent(twins[:, looked][sent], starts[:, looked][sent] - due[:, looked][sent]):
                return None
    start_of = np.empty(len(order))
    twin_of = np.empty(len(order), dtype=np.int64)
    start_of[order] = starts[replica[order], column]
    twin_of[order] = twins[replica[order], column]
    return Outcome(arrivals, start_of - arrivals, twin_of)


def _in_turn(
    arrivals: np.ndarray,
    route: np.ndarray | None,
    draws: np.ndarray,
    table: np.ndarray,
    service_s: np.ndarray,
    replicas: int,
    slots: int,
    budget: MissBudget | None,
) -> Outcome | None:
    """Each request in turn, to its replica in ``route`` or (None) to the one with the fewest in flight; None once
    ``budget`` is spent. Replicas are kept in buckets by their count in flight (of a bucket's, the one that entered
    it last is chosen); departures on one heap of integer keys (tick × replicas + replica), popped as arrivals pass
    them. Every line of the loop costs: this loop is most of a least-requests plan's time."""
    count = len(arrivals)
    ticks_per_s = _TICKS_PER_S
    times = arrivals.tolist()
    ticks = (np.floor(arrivals * ticks_per_s).astype(np.int64) * replicas + replicas - 1).tolist()
    rows = [row.tolist() for row in table]  # grows with the buckets: more in flight than slots draws as at slots
    service = service_s.tolist()
    drawn = draws.tolist()
    routes = route.tolist() if route is not None else [None] * count
    free_at = [[0.0] * slots for _ in range(replicas)]  # per replica, a heap of when its slots free up
    in_flight = [0] * replicas
    buckets: list[dict[int, None]] = [dict.fromkeys(range(replicas))]  # count in flight -> replicas, in order
    fewest = 0
    departures: list[int] = []
    waits: list[float] = []
    twins: list[int] = []
    add_wait, add_twin = waits.append, twins.append
    pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
    for first in range(0, count, _REQUESTS_PER_LOOK):
        last = min(first + _REQUESTS_PER_LOOK, count)
        if budget is not None and first:
            looked = slice(first - _REQUESTS_PER_LOOK, first)
            if budget.spent(np.asarray(twins[looked]), np.asarray(waits[looked])):
                return None
        chunk = slice(first, last)
        for now, tick, draw, r in zip(times[chunk], ticks[chunk], drawn[chunk], routes[chunk], strict=True):
            while departures and departures[0] <= tick:
                gone = pop(departures) % replicas
                held = in_flight[gone]
                del buckets[held][gone]
                held -= 1
                buckets[held][gone] = None
                in_flight[gone] = held
                if held < fewest:
                    fewest = held
            if r is None:
                while not buckets[fewest]:
                    fewest += 1
                r = buckets[fewest].popitem()[0]
                held = fewest + 1
            else:
                held = in_flight[r]
                del buckets[held][r]
                held += 1
            if held == len(buckets):
                buckets.append({})
                rows.append(rows[slots])
            buckets[held][r] = None
            in_flight[r] = held
            slots_of = free_at[r]
            start = slots_of[0]
            if now > start:
                start = now
            twin = rows[held][draw]
            end = start + service[twin]
            replace(slots_of, end)
            push(departures, int(end * ticks_per_s) * replicas + r)
            add_wait(start - now)
            add_twin(twin)
    return Outcome(arrivals, np.asarray(waits), np.asarray(twins, dtype=np.int64))


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
    rank = _rank(percentile, len(column))
    if rank > len(column):
        return None
    value = float(np.partition(np.where(np.isnan(column), np.inf, column), rank - 1)[rank - 1])
    return None if math.isinf(value) else value


def _rank(percentile: float, requests: int) -> int:
    """The nearest rank of ``percentile`` among ``requests`` values (whole thousandths of a percent, as perf)."""
    return max(1, -(-round(percentile * 1000) * requests // 100_000))
