"""One replica's measured curve: per load level, how many requests it held, its throughput, and every measured
request's latencies, read from a perf run (summary.json and requests.jsonl) and held against an SLO.

A closed-loop level held ``concurrency`` requests in flight. An open-loop level is placed by Little's law: the
requests it held on average are its throughput times its mean end-to-end latency. Either way a level says what a
request's latencies are when that many requests share the replica.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import NotFoundError, UsageError
from ..perf.compare import read_run
from ..perf.report import REQUESTS_JSONL
from ..perf.slo import KNOWN_METRICS, Limit, Slo, SloTally


class SloUnmet(UsageError):
    """No measured level of a replica meets the SLO: no number of replicas will."""


@dataclass(frozen=True)
class MeasuredLevel:
    """A level as perf measured it: its load, its throughput and its measured requests' ``requests.jsonl`` rows
    (each with ``e2e_ms``, ``error`` and the request's metrics)."""

    concurrency: int | None
    request_rate: float | None
    #: Successful requests per second.
    throughput: float
    rows: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class CurveLevel:
    """One load level of a replica, held against the curve's SLO."""

    #: Requests in flight on the replica: the closed-loop concurrency, or (open loop) throughput × mean E2E.
    concurrency: float
    throughput: float
    request_rate: float | None
    #: Share of the level's requests meeting the SLO's per-request limits (None without such limits).
    attainment: float | None
    slo_met: bool
    #: Where the level's requests are in the curve's sample arrays (``start:stop``).
    start: int
    stop: int

    @property
    def label(self) -> str:
        """``8`` (concurrency) or ``2.5/s`` (an open-loop level's rate)."""
        return f"{self.concurrency:g}" if self.request_rate is None else f"{self.request_rate:g}/s"


@dataclass(frozen=True)
class ReplicaCurve:
    """A replica's levels (by concurrency) and its measured requests, held against ``slo``."""

    label: str
    family: str
    stream: bool
    slo: Slo
    levels: tuple[CurveLevel, ...]
    #: Per measured request, the levels' requests one after another: how long it held the replica, in seconds
    #: (its end-to-end latency; a failed request's time to its failure).
    service_s: np.ndarray
    #: Per measured request, each metric it has (ms; RTF unitless); NaN where it has none (a failed request).
    samples: Mapping[str, np.ndarray]
    #: GPUs one replica (one measured server) takes; None when the run does not record its build.
    gpus: int | None = None
    build: Mapping[str, Any] | None = None

    @classmethod
    def from_levels(
        cls,
        label: str,
        slo: Slo,
        levels: Sequence[MeasuredLevel],
        *,
        family: str = "llm",
        stream: bool = True,
        gpus: int | None = None,
        build: Mapping[str, Any] | None = None,
    ) -> ReplicaCurve:
        """The curve of ``levels``, each held against ``slo`` as perf holds a level (its requests one by one
        through a :class:`~trtdeploy.perf.slo.SloTally`)."""
        placed = sorted(((_in_flight(level), level) for level in levels if level.rows), key=lambda pair: pair[0])
        built: list[CurveLevel] = []
        service: list[float] = []
        columns: dict[str, list[float]] = {metric: [] for metric in KNOWN_METRICS}
        for concurrency, level in placed:
            tally = SloTally(slo)
            for row in level.rows:
                failed = row.get("error") is not None
                tally.add(None if failed else row)
                service.append(float(row["e2e_ms"]) / 1e3)
                for metric, column in columns.items():
                    value = None if failed else Limit(metric, math.inf).measure(row)
                    column.append(math.nan if value is None else float(value))
            summary = tally.summary()
            start = built[-1].stop if built else 0
            built.append(
                CurveLevel(
                    concurrency=concurrency,
                    throughput=level.throughput,
                    request_rate=level.request_rate,
                    attainment=summary["attainment"],
                    slo_met=summary["slo_met"],
                    start=start,
                    stop=start + len(level.rows),
                )
            )
        if not built:
            raise UsageError(f"{label} has no measured request", hint="pass a run that measured at least one level")
        samples = {metric: np.asarray(values) for metric, values in columns.items() if not np.isnan(values).all()}
        return cls(label, family, stream, slo, tuple(built), np.asarray(service), samples, gpus, build)

    @property
    def best(self) -> CurveLevel:
        """The level a replica is run at: the most throughput among the levels meeting the SLO (the lower
        concurrency of equals). SloUnmet when no level meets it."""
        meeting = [level for level in self.levels if level.slo_met]
        if not meeting:
            measured = ", ".join(level.label for level in self.levels)
            raise SloUnmet(
                f"{self.label}: the SLO ({self.slo.describe()}) cannot be met by one replica at any measured load "
                f"(levels {measured})",
                hint="measure lower loads (perf --concurrency 1,2 or --request-rate), or relax --slo/--attainment",
            )
        return max(meeting, key=lambda level: (level.throughput, -level.concurrency))

    @property
    def slots(self) -> int:
        """Requests a replica serves at once, the others waiting their turn: the concurrency of :attr:`best`."""
        return max(1, round(self.best.concurrency))


def _in_flight(level: MeasuredLevel) -> float:
    """Requests the level held in flight: its concurrency, or by Little's law its throughput × mean E2E."""
    if level.concurrency is not None:
        return float(level.concurrency)
    ok = [float(row["e2e_ms"]) for row in level.rows if row.get("error") is None]
    return level.throughput * (sum(ok) / len(ok) / 1e3) if ok else 0.0


def read_curve(path: Path, slo: Slo | None = None, *, label: str | None = None) -> ReplicaCurve:
    """The curve of the perf run in folder ``path`` held against ``slo`` (None: the SLO the run was measured
    against). Its measured requests come from requests.jsonl, its levels' throughputs from summary.json, its GPUs
    from the build it records."""
    run = read_run(path)
    slo = slo or run.slo
    if slo is None:
        raise UsageError(
            f"{path} was measured without an SLO, and none is given",
            hint="pass --slo, e.g. --slo 'e2e_ms_p99<=2000'",
        )
    summary = run.summary
    slo.check(summary["family"], summary["stream"])
    requests = path / REQUESTS_JSONL
    if not requests.is_file():
        raise NotFoundError(
            f"{path} has no {REQUESTS_JSONL}: the latencies of its requests are needed",
            hint="pass a run folder as `trtdeploy perf` writes it",
        )
    rows: dict[int, list[dict[str, Any]]] = {}
    with open(requests, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise UsageError(
                    f"{requests}:{number} is not JSON", hint="rerun perf: the run's files are damaged"
                ) from None
            if not row.get("warmup"):
                rows.setdefault(row["level"], []).append(row)
    levels = [
        MeasuredLevel(level["concurrency"], level["request_rate"], level["request_throughput"] or 0.0, measured)
        for index, level in enumerate(summary["levels"])
        if (measured := rows.get(level.get("level", index)))
    ]
    build = summary.get("build")
    gpus = build.get("gpus_needed") if build else None
    return ReplicaCurve.from_levels(
        label or path.name,
        slo,
        levels,
        family=summary["family"],
        stream=summary["stream"],
        gpus=gpus,
        build=build,
    )
