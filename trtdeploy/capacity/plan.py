"""Capacity for a target request rate: how many replicas of a measured deployment meet the SLO, their GPUs and
pods, their simulated latencies behind each balancer, and the HPA target per replica that keeps the headroom."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..perf.compare import default_labels, read_run, run_folders
from ..perf.slo import Slo
from .curves import ReplicaCurve, SloUnmet, read_curve
from .simulate import Load, Outcome, latencies, nearest_rank, percentiles, simulate
from .workers import Job, available_workers, run_jobs

#: The share of a replica's SLO throughput kept spare, unless --headroom says otherwise.
DEFAULT_HEADROOM = 0.2
#: The planner gives up when this many times the replicas that the throughput alone needs still miss the SLO.
_MAX_FACTOR = 16
#: The replica search scouts on a load this many requests long (when the planned load is longer), then confirms its
#: answer on the whole load.
_SCOUT_REQUESTS = 250_000
#: The balancers in the order a replica count is tried behind them: the likeliest to miss the SLO first (least-requests
#: is never worse than round-robin, round-robin than random), so a count that misses is mostly told by one.
_LIKELIEST_TO_MISS = ("random", "round-robin", "least-requests")
#: Loads of this many requests or more are simulated side by side in worker processes (fewer: forking costs more
#: than it saves).
_SIDE_BY_SIDE_FROM = 100_000
#: A simulation's memory per request at its peak (about 230 bytes measured behind least-requests).
_BYTES_PER_REQUEST = 256
#: The most requests one simulation may hold (rate × duration): about 2 GB of memory behind least-requests.
MAX_SIMULATED_REQUESTS = 10_000_000


@dataclass(frozen=True)
class HpaTarget:
    """What a HorizontalPodAutoscaler should hold each replica at (its leader pod, for a replica of several pods):
    the average requests in flight (in service or waiting) of one replica that Poisson arrivals at ``1 - headroom``
    of the most it serves under the SLO give it, simulated from the measured curve. A fleet at or below that rate
    per replica averages no more in flight behind any balancer (round-robin and least-requests smooth a replica's
    arrivals), so the HPA scales out only past the planned load."""

    #: The target average of requests in flight per replica (an HPA ``AverageValue``).
    in_flight: float
    #: Requests/s a replica serves at that target.
    rate: float
    #: Requests in flight at which one replica still met the SLO with the most throughput (the measured level).
    slots: int
    #: Requests/s one replica serves there.
    throughput: float
    headroom: float
    slo: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Requests simulated for an HPA target: the mean in flight of one replica settles within ~1% well before.
_HPA_REQUESTS = 50_000


def hpa_target(curve: ReplicaCurve, *, headroom: float = DEFAULT_HEADROOM, seed: int = 0) -> HpaTarget:
    """The HPA target of ``curve`` (see :class:`HpaTarget`). UsageError when no level meets the curve's SLO, or for
    a headroom outside [0, 1)."""
    check_headroom(headroom)
    best = curve.best
    rate = best.throughput * (1 - headroom)
    load = Load(rate, duration_s=_HPA_REQUESTS / rate, seed=seed)
    in_flight = mean_in_flight(curve, simulate(curve, 1, load, "random"), load, replicas=1)
    return HpaTarget(in_flight, rate, curve.slots, best.throughput, headroom, curve.slo.describe())


def mean_in_flight(curve: ReplicaCurve, outcome: Outcome, load: Load, *, replicas: int) -> float:
    """Average requests in flight per replica over the simulated load (Little's law: time in the system / time)."""
    return float((outcome.wait_s + curve.service_s[outcome.twin]).sum()) / load.duration_s / replicas


def recommend_hpa(run_dir: Path, *, slo: Slo | None = None, headroom: float = DEFAULT_HEADROOM) -> HpaTarget:
    """The HPA target per replica for the deployment measured by the perf run in ``run_dir``, under ``slo`` (None:
    the SLO the run was measured against). UsageError when the run has no SLO and none is given, or none of its
    levels meets it; NotFoundError when ``run_dir`` is not a perf run."""
    return hpa_target(read_curve(run_dir, slo), headroom=headroom)


def check_headroom(headroom: float) -> None:
    if not 0 <= headroom < 1:
        raise UsageError(
            f"--headroom must be >= 0 and < 1 (the share of a replica kept spare), got {headroom:g}",
            hint="e.g. --headroom 0.2",
        )


def check_load(load: Load) -> None:
    """UsageError for a duration that is not finite and > 0, or a load of more than MAX_SIMULATED_REQUESTS."""
    if not 0 < load.duration_s < math.inf:
        raise UsageError(f"--duration must be > 0 seconds, got {load.duration_s:g}", hint="e.g. --duration 3600")
    requests = load.rate * load.duration_s
    if requests > MAX_SIMULATED_REQUESTS:
        raise UsageError(
            f"{load.rate:g} req/s for {load.duration_s:g} s is {requests:,.0f} requests to simulate, more than the "
            f"{MAX_SIMULATED_REQUESTS:,} one simulation holds",
            hint=f"a shorter --duration (at most {MAX_SIMULATED_REQUESTS / load.rate:,.0f} s at this rate) or a lower "
            "--target-rate",
        )


@dataclass(frozen=True)
class Simulated:
    """The simulated fleet behind one balancer: its latencies (ms; RTF unitless), the SLO held against them, and
    the requests in flight per replica against the HPA target."""

    balancing: str
    requests: int
    percentiles: Mapping[str, Mapping[str, float | None]]
    wait_ms: Mapping[str, float]
    attainment: float | None
    slo_percentiles: Mapping[str, float | None]
    slo_met: bool
    #: Average requests in flight per replica (Little's law over the simulated hour).
    in_flight: float
    #: The share of the HPA target that the average in flight leaves spare (below 0: the HPA would scale out).
    hpa_headroom: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def held_against(slo: Slo, values: Mapping[str, np.ndarray]) -> tuple[float | None, dict[str, float | None], bool]:
    """Attainment, percentile limits' values and whether ``slo`` is met by simulated requests' ``values``, as perf
    holds a level against it (:class:`~trtdeploy.perf.slo.SloTally`, vectorised: a missing value meets no bound)."""
    met = np.ones(len(next(iter(values.values()))), dtype=bool)
    for limit in slo.per_request:
        met &= values[limit.metric] <= limit.bound
    attainment = float(met.mean()) if slo.per_request and len(met) else None
    found = {limit.key: nearest_rank(values[limit.metric], limit.percentile or 0) for limit in slo.percentiles}
    held = all(
        value is not None and value <= limit.bound for limit, value in zip(slo.percentiles, found.values(), strict=True)
    )
    attained = not slo.per_request or (attainment is not None and attainment >= slo.attainment)
    return attainment, found, attained and held


def simulate_fleet(
    curve: ReplicaCurve, replicas: int, load: Load, balancing: str, hpa: HpaTarget, *, stop_when_missed: bool = False
) -> Simulated | None:
    """``replicas`` replicas of ``curve`` behind ``balancing`` under ``load``, summarised; None when
    ``stop_when_missed`` and the simulation stopped as soon as the SLO was missed for sure."""
    outcome = simulate(curve, replicas, load, balancing, stop_past=curve.slo if stop_when_missed else None)
    if outcome is None:
        return None
    values = latencies(curve, outcome)
    attainment, found, met = held_against(curve.slo, values)
    wait_ms = outcome.wait_s * 1e3
    in_flight = mean_in_flight(curve, outcome, load, replicas=replicas)
    return Simulated(
        balancing=balancing,
        requests=len(outcome.arrival_s),
        percentiles=percentiles(values),
        wait_ms={
            "mean": float(wait_ms.mean()) if len(wait_ms) else 0.0,
            "p99": float(np.percentile(wait_ms, 99)) if len(wait_ms) else 0.0,
        },
        attainment=attainment,
        slo_percentiles=found,
        slo_met=met,
        in_flight=in_flight,
        hpa_headroom=1 - in_flight / hpa.in_flight,
    )


@dataclass(frozen=True)
class Plan:
    """The replicas, GPUs and pods for a target rate from one measured deployment, and its simulated fleet."""

    label: str
    target_rate: float
    slo: str
    headroom: float
    #: The measured level a replica is run at (its concurrency or rate) and what one replica serves there.
    level: str
    slots: int
    replica_throughput: float
    #: Replicas the throughput alone needs with the headroom kept (the search starts there).
    replicas_for_throughput: int
    replicas: int
    gpus_per_replica: int
    pods_per_replica: int
    hpa: HpaTarget
    simulated: tuple[Simulated, ...]
    #: Each replica count simulated on the whole load, and whether every balancer met the SLO with it.
    tried: tuple[tuple[int, bool], ...]
    #: Each replica count simulated on the search's shorter scouting load (none when the load is no longer), and
    #: whether every balancer met the SLO with it there.
    scouted: tuple[tuple[int, bool], ...] = ()

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def pods(self) -> int:
        return self.replicas * self.pods_per_replica

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["hpa"] = self.hpa.to_dict()
        data["tried"] = [{"replicas": n, "slo_met": met} for n, met in self.tried]
        data["scouted"] = [{"replicas": n, "slo_met": met} for n, met in self.scouted]
        return {**data, "gpus": self.gpus, "pods": self.pods}


def plan(
    curve: ReplicaCurve,
    target_rate: float,
    *,
    balancing: Sequence[str] = ("round-robin", "least-requests"),
    headroom: float = DEFAULT_HEADROOM,
    load: Load | None = None,
    gpus_per_replica: int | None = None,
    gpus_per_node: int = 8,
    say: Callable[[str], None] | None = None,
) -> Plan:
    """The fewest replicas of ``curve``, no fewer than ``target_rate`` needs with ``headroom`` kept spare, whose
    simulated fleet meets the curve's SLO behind every balancer of ``balancing``.

    The search simulates from the throughput's count up, doubling the step until the SLO is met, then halving back
    to the fewest that meet it (more replicas never make a balancer's queues longer). A load longer than
    ``_SCOUT_REQUESTS`` requests is searched first on a load of ``_SCOUT_REQUESTS`` (same rate and shape), behind
    the balancers other than least-requests where any is asked for (it never needs more replicas than round-robin);
    the count found there is then simulated on the whole load with the count below it, and the search goes on from
    them on the whole load when either disagrees. A count is tried behind one balancer after another and stops at the
    first that misses the SLO, each simulation as soon as it misses it for sure; where the machine has cores to
    spare, the balancers of a count, and the two counts confirmed on the whole load, are simulated side by side (see
    :func:`_judge`). The answer is the fewest replicas whose whole load meets the SLO behind every balancer, as a
    search on the whole load alone finds. ``load`` sets the simulated load's shape and length (its rate is
    ``target_rate``); ``say`` is told each count's verdict as it comes."""
    if not 0 < target_rate < math.inf:
        raise UsageError(f"--target-rate must be > 0 requests/s, got {target_rate:g}", hint="e.g. --target-rate 50")
    load = replace(load or Load(target_rate), rate=target_rate)
    check_load(load)
    if gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be >= 1, got {gpus_per_node}", hint="e.g. --gpus-per-node 8")
    gpus = gpus_per_replica or curve.gpus
    if gpus is None:
        raise UsageError(
            f"{curve.label} does not record the build it measured, so the GPUs of a replica are not known",
            hint="pass --gpus-per-replica",
        )
    missing = [limit.key for limit in curve.slo.limits if limit.metric not in curve.samples]
    if missing:
        raise UsageError(
            f"{curve.label} measured no value for --slo {', '.join(missing)}",
            hint=f"SLO keys it has values for: {', '.join(curve.samples)}",
        )
    hpa = hpa_target(curve, headroom=headroom)
    first = max(1, math.ceil(target_rate / hpa.rate))
    most = _MAX_FACTOR * first
    # least-requests is never worse than round-robin on identical replicas, and the only balancer simulated request
    # by request: scouting leaves it to the whole load where another balancer is asked for
    scouts_behind = [name for name in balancing if name != "least-requests"] or list(balancing)
    verdicts: dict[tuple[Load, int], bool] = {}
    kept: dict[int, tuple[Simulated, ...]] = {}  # counts whose whole load met the SLO: their fleets

    def meet(counts: Sequence[int], trial: Load) -> dict[int, bool]:
        """Whether each of ``counts`` replicas meets the SLO on ``trial``, judged side by side where cores allow."""
        todo = [n for n in counts if (trial, n) not in verdicts]
        if todo:
            behind = balancing if trial == load else scouts_behind
            if say is not None:
                scouting = " (scouting)" if trial != load else ""
                say(
                    f"simulating {' and '.join(map(str, todo))} replicas over {trial.duration_s:,.0f} s of "
                    f"load{scouting} behind {', '.join(behind)}"
                )
            for replicas, fleet in _judge(curve, hpa, behind, todo, trial).items():
                verdicts[trial, replicas] = fleet is not None
                if fleet is not None and trial == load:
                    kept[replicas] = fleet
                if say is not None:
                    say(f"{replicas} replicas: SLO {'met' if fleet is not None else 'missed'}")
        return {n: verdicts[trial, n] for n in counts}

    def fewest(trial: Load, low: int, high: int) -> int | None:
        """The fewest replicas meeting the SLO on ``trial``, ``low`` known to miss it, tried from ``high`` up
        (None: even ``most`` miss)."""
        step = 1
        while not meet([high], trial)[high]:
            if high >= most:
                return None
            low, step = high, step * 2
            high = min(high + step, most)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if meet([middle], trial)[middle] else (middle, high)
        return high

    scout = replace(load, duration_s=_SCOUT_REQUESTS / target_rate)
    guess = first if scout.duration_s >= load.duration_s else fewest(scout, first - 1, first) or most
    # first - 1 replicas are too few for the rate: they miss. The count below the guess is judged on the whole load
    # with the guess itself where a worker is free to judge it meanwhile.
    below = [guess - 1, guess] if _workers(load) > 1 else [guess - 1]
    if guess > first and meet(below, load)[guess - 1]:
        found = fewest(load, first - 1, guess - 1)
    else:
        found = fewest(load, guess - 1, guess)
    if found is None:
        raise UsageError(
            f"{curve.label}: even {most} replicas miss the SLO ({curve.slo.describe()}) in simulation at "
            f"{target_rate:g} req/s",
            hint="a replica meets it only when it is nearly idle: relax --slo, or measure lower loads",
        )
    by_count = sorted(verdicts.items(), key=lambda each: each[0][1])
    return Plan(
        label=curve.label,
        target_rate=target_rate,
        slo=curve.slo.describe(),
        headroom=headroom,
        level=curve.best.label,
        slots=curve.slots,
        replica_throughput=curve.best.throughput,
        replicas_for_throughput=first,
        replicas=found,
        gpus_per_replica=gpus,
        pods_per_replica=math.ceil(gpus / gpus_per_node),
        hpa=hpa,
        simulated=kept[found],
        tried=tuple((n, met) for (trial, n), met in by_count if trial == load),
        scouted=tuple((n, met) for (trial, n), met in by_count if trial != load),
    )


def _judge(
    curve: ReplicaCurve, hpa: HpaTarget, balancing: Sequence[str], counts: Sequence[int], trial: Load
) -> dict[int, tuple[Simulated, ...] | None]:
    """Per replica count, its fleet behind each of ``balancing`` (in that order) when every one meets the SLO on
    ``trial``, else None; each simulation stops once it misses for sure, and a count's other simulations once one
    of them has.

    In turn, the counts are tried from the fewest, each behind the likeliest balancer to miss first. Side by side,
    the largest count is the likeliest to meet, so all of its simulations will be needed: they start first,
    least-requests (the one taken request by request, the slowest) leading; then the other counts as in turn."""
    workers = _workers(trial)
    likeliest_first = sorted(balancing, key=_LIKELIEST_TO_MISS.index)
    *others, largest = sorted(counts)
    if workers > 1:
        order = [(largest, name) for name in reversed(likeliest_first)]
        order += [(n, name) for n in others for name in likeliest_first]
    else:
        order = [(n, name) for n in (*others, largest) for name in likeliest_first]
    jobs = [Job(n, partial(simulate_fleet, curve, n, trial, name, hpa, stop_when_missed=True)) for n, name in order]
    results = run_jobs(jobs, lambda simulated: simulated is not None and simulated.slo_met, workers)
    fleets = {order[index]: simulated for index, simulated in results.items()}
    met = {n: all(getattr(fleets.get((n, name)), "slo_met", False) for name in balancing) for n in counts}
    return {n: tuple(fleets[n, name] for name in balancing) if met[n] else None for n in counts}


def _workers(trial: Load) -> int:
    """How many simulations of ``trial`` run at once: side by side from ``_SIDE_BY_SIDE_FROM`` requests, as the
    cores and the memory allow."""
    requests = trial.rate * trial.duration_s
    if requests < _SIDE_BY_SIDE_FROM:
        return 1
    return available_workers(math.ceil(requests * _BYTES_PER_REQUEST))


def _labelled(say: Callable[[str], None], label: str, line: str) -> None:
    say(f"{label}: {line}")


@dataclass(frozen=True)
class SweepPlan:
    """A plan per measured point of a sweep (or why a point cannot meet the SLO), and the point with the fewest
    GPUs."""

    plans: tuple[Plan, ...]
    #: label -> why the point cannot meet the SLO.
    excluded: Mapping[str, str]

    @property
    def best(self) -> Plan:
        return min(self.plans, key=lambda each: (each.gpus, each.pods, each.replicas))

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": self.best.label,
            "plans": [each.to_dict() for each in self.plans],
            "excluded": dict(self.excluded),
        }


def plan_runs(paths: Sequence[Path], target_rate: float, *, slo: Slo | None = None, **options: Any) -> SweepPlan:
    """A :func:`plan` for each run in ``paths`` (a sweep's folder: its measured points' runs), labelled as
    ``trtdeploy report`` labels them; a point whose SLO no level meets is excluded with the reason. UsageError
    when no point can meet it."""
    folders = run_folders(paths)
    labels = default_labels([read_run(folder) for folder in folders])
    plans: list[Plan] = []
    excluded: dict[str, str] = {}
    say = options.pop("say", None)
    for folder, label in zip(folders, labels, strict=True):
        tell = partial(_labelled, say, label) if say is not None and len(folders) > 1 else say
        try:
            plans.append(plan(read_curve(folder, slo, label=label), target_rate, say=tell, **options))
        except SloUnmet as exc:
            if len(folders) == 1:
                raise
            excluded[label] = exc.message
    if not plans:
        raise UsageError(
            f"no point of {', '.join(map(str, paths))} meets the SLO at any measured load (one replica)",
            hint="relax --slo/--attainment, or sweep lower loads",
        )
    return SweepPlan(tuple(plans), excluded)
