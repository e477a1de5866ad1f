"""Service-level objectives: ``--slo ttft_ms<=200,rtf_p95<=1`` read, checked against a workload, and evaluated.

A limit without a percentile suffix bounds every request: the share of a level's measured requests that meet all
such limits is its attainment (and those requests per second its goodput). A limit with one (``rtf_p95<=1``)
bounds the level: at least that percentage of its measured requests must be within it. A level meets the SLO when
its attainment reaches the target share (when it has per-request limits) and every percentile limit holds.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

#: The metrics an SLO may bound, per family: (streamed, offline). All in ms but the RTF.
SLO_METRICS = {
    "llm": (("ttft_ms", "itl_ms", "e2e_ms"), ("e2e_ms",)),
    "tts": (("first_chunk_ms", "e2e_ms", "rtf"), ("e2e_ms", "rtf")),
    "asr": (("first_partial_ms", "e2e_ms", "rtf"), ("e2e_ms", "rtf")),
}
KNOWN_METRICS = tuple(sorted({metric for modes in SLO_METRICS.values() for mode in modes for metric in mode}))
#: The share of a level's requests that must meet every per-request limit, unless --attainment says otherwise.
DEFAULT_ATTAINMENT = 0.95
EXAMPLE = "e.g. --slo 'ttft_ms<=500,itl_ms_p90<=50' (quoted: a shell reads < as a redirection)"

_PERCENTILE = re.compile(r"(?P<metric>.+)_p(?P<percentile>\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Limit:
    """``metric <= bound`` for every request, or (with ``percentile``) for that percentage of a level's requests."""

    metric: str
    bound: float
    percentile: float | None = None

    @property
    def key(self) -> str:
        """The limit's name as written: ``rtf_p95``, ``ttft_ms``."""
        return self.metric if self.percentile is None else f"{self.metric}_p{self.percentile:g}"

    def __str__(self) -> str:
        return f"{self.key}<={self.bound:g}"

    def measure(self, metrics: Mapping[str, Any]) -> float | None:
        """The request's value to hold against the bound; None when it has none, which meets no bound.

        A request without a value for the metric produced nothing to time (no token, no audio), except a request
        without an ITL but with a TTFT: every token came in its first chunk, so no gap between tokens can exceed
        the bound (0).
        """
        value = metrics.get(self.metric)
        if value is None and self.metric == "itl_ms" and metrics.get("ttft_ms") is not None:
            return 0.0
        return value

    def met_by(self, metrics: Mapping[str, Any]) -> bool:
        value = self.measure(metrics)
        return value is not None and value <= self.bound


@dataclass(frozen=True)
class Slo:
    """The limits of ``--slo`` and the share of requests (``--attainment``) that must meet the per-request ones."""

    limits: tuple[Limit, ...]
    attainment: float = DEFAULT_ATTAINMENT

    def __post_init__(self) -> None:
        if not self.limits:
            raise UsageError("--slo needs at least one limit", hint=EXAMPLE)
        if not 0 < self.attainment <= 1:
            raise UsageError(
                f"--attainment must be > 0 and <= 1 (a share of the requests), got {self.attainment:g}",
                hint="e.g. --attainment 0.95",
            )
        for limit in self.limits:
            if limit.metric not in KNOWN_METRICS:
                raise UsageError(
                    f"--slo {limit}: unknown key {limit.key!r}",
                    hint=f"keys: {', '.join(KNOWN_METRICS)}, each with an optional percentile suffix (rtf_p95)",
                )
            if not 0 < limit.bound < math.inf:
                raise UsageError(f"--slo {limit}: a limit must be > 0", hint=EXAMPLE)
            if limit.percentile is not None and not 0 < limit.percentile <= 100:
                raise UsageError(f"--slo {limit}: the percentile must be > 0 and <= 100", hint="e.g. rtf_p95<=1")
        keys = [limit.key for limit in self.limits]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:
            raise UsageError(f"--slo gives {', '.join(twice)} twice", hint="give each key one limit")

    @classmethod
    def parse(cls, text: str, attainment: float | None = None) -> Slo:
        """``ttft_ms<=500,rtf_p95<=1`` (``KEY=LIMIT`` reads as ``KEY<=LIMIT``)."""
        limits = [_parse_limit(item) for item in text.split(",") if item.strip()]
        return cls(tuple(limits), DEFAULT_ATTAINMENT if attainment is None else attainment)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Slo:
        """The SLO that :meth:`to_dict` wrote (into summary.json)."""
        text = ",".join(f"{key}<={bound!r}" for key, bound in data["limits"].items())
        return cls.parse(text, data["attainment"])

    @property
    def per_request(self) -> tuple[Limit, ...]:
        return tuple(limit for limit in self.limits if limit.percentile is None)

    @property
    def percentiles(self) -> tuple[Limit, ...]:
        return tuple(limit for limit in self.limits if limit.percentile is not None)

    def check(self, family: str, stream: bool | None) -> None:
        """Raise UsageError unless every limit bounds a metric that this family measures in this mode (``stream``
        None: in either mode)."""
        streamed, offline = SLO_METRICS.get(family, SLO_METRICS["llm"])
        known = offline if stream is False else streamed if stream else tuple(dict.fromkeys(streamed + offline))
        unknown = [limit.key for limit in self.limits if limit.metric not in known]
        if unknown:
            mode = {True: "streamed ", False: "offline (not streamed) ", None: ""}[stream]
            raise UsageError(
                f"--slo {', '.join(unknown)} cannot be measured for {mode}{family} requests",
                hint=f"SLO keys here: {', '.join(known)} (each may take a percentile suffix, e.g. {known[-1]}_p95)",
            )

    def meets(self, metrics: Mapping[str, Any]) -> bool:
        """Whether one successful request meets every per-request limit."""
        return all(limit.met_by(metrics) for limit in self.per_request)

    def describe(self) -> str:
        """``ttft_ms<=200 for 95% of requests, rtf_p95<=1``."""
        parts = []
        if self.per_request:
            share = f"{100 * self.attainment:g}%"
            parts.append(f"{', '.join(map(str, self.per_request))} for {share} of requests")
        parts += [str(limit) for limit in self.percentiles]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"limits": {limit.key: limit.bound for limit in self.limits}, "attainment": self.attainment}


def _parse_limit(item: str) -> Limit:
    text = item.strip()
    if any(sign in text.replace("<=", "") for sign in "<>"):
        raise UsageError(f"--slo {text}: limits are upper bounds", hint="write KEY<=LIMIT, " + EXAMPLE)
    key, sep, value = text.partition("<=")
    if not sep:
        key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise UsageError(f"--slo: {text!r} is not KEY<=LIMIT", hint=EXAMPLE)
    try:
        bound = float(value)
    except ValueError:
        raise UsageError(f"--slo {text}: the limit must be a number", hint=EXAMPLE) from None
    match = _PERCENTILE.fullmatch(key)
    if match is None:
        return Limit(key, bound)
    return Limit(match["metric"], bound, float(match["percentile"]))


class SloTally:
    """A level's measured requests held against an SLO one at a time: how many meet every per-request limit, and
    the values that the percentile limits are read from (a few bytes per request)."""

    def __init__(self, slo: Slo) -> None:
        self.slo = slo
        self.requests = 0
        self.met = 0
        self.values = {limit.key: array("d") for limit in slo.percentiles}

    def add(self, metrics: Mapping[str, Any] | None) -> None:
        """Count one measured request with its metrics (None: it failed, and meets no limit)."""
        self.requests += 1
        if metrics is None:
            return
        self.met += self.slo.meets(metrics)
        for limit in self.slo.percentiles:
            value = limit.measure(metrics)
            if value is not None:
                self.values[limit.key].append(value)

    def percentile(self, limit: Limit) -> float | None:
        """The value that ``limit.percentile`` % of the measured requests do not exceed (nearest rank), where a
        request without a value (failed, or nothing to time) counts as above any bound; None when such requests
        reach that rank."""
        assert limit.percentile is not None
        values = sorted(self.values[limit.key])
        # integer arithmetic: a float product can land just above a whole rank (55 / 100 * 100 = 55.000000000000007)
        rank = max(1, -(-round(limit.percentile * 1000) * self.requests // 100_000))
        return values[rank - 1] if rank <= len(values) else None

    def summary(self) -> dict[str, Any]:
        """attainment, the percentile limits' values (``slo_percentiles``), and whether the level met the SLO."""
        attainment = self.met / self.requests if self.requests else None
        percentiles = {limit.key: self.percentile(limit) for limit in self.slo.percentiles}
        held = all(
            value is not None and value <= limit.bound
            for limit, value in zip(self.slo.percentiles, percentiles.values(), strict=True)
        )
        # without per-request limits the percentile limits alone decide (failed requests already count as over)
        attained = attainment is not None and (not self.slo.per_request or attainment >= self.slo.attainment)
        return {
            "attainment": attainment,
            "slo_percentiles": percentiles or None,
            "slo_met": attained and held,
        }
