"""Server-side numbers: ``/v2/models/stats`` and the Prometheus counters, snapshotted around each level, and the
Prometheus gauges, sampled while it runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .control import fetch_metrics

if TYPE_CHECKING:
    from .control import ControlClient
    from .openai_api import OpenAIControl

#: Statistics of ``/v2/models/stats`` kept per model: each has a count and a total duration in ns.
_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class Snapshot:
    """Cumulative server counters at one moment."""

    #: model name → counter name → value (summed over versions).
    models: dict[str, dict[str, int]]
    #: Prometheus series → value, or None when /metrics could not be read.
    metrics: dict[str, float] | None = None
    #: Prometheus metric name → type (counter, gauge, ...).
    metric_types: dict[str, str] = field(default_factory=dict)


def _model_counters(model_stats: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    models: dict[str, dict[str, int]] = {}
    for entry in model_stats:
        counters = models.setdefault(entry["name"], {})
        stats = entry.get("inference_stats", {})
        for name in _DURATIONS:
            part = stats.get(name, {})
            counters[f"{name}_count"] = counters.get(f"{name}_count", 0) + int(part.get("count", 0))
            counters[f"{name}_ns"] = counters.get(f"{name}_ns", 0) + int(part.get("ns", 0))
        for name in ("inference_count", "execution_count"):
            counters[name] = counters.get(name, 0) + int(entry.get(name, 0))
    return models


def parse_prometheus(text: str) -> tuple[dict[str, float], dict[str, str]]:
    """Series values (keyed by ``name{labels}``) and metric types from the Prometheus text format."""
    values: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
        elif line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            try:
                values[series] = float(value)
            except ValueError:
                continue
    return values, types


async def snapshot(control: ControlClient | OpenAIControl, metrics_url: str | None) -> Snapshot:
    """The server's counters now (raises when the statistics cannot be read; metrics are optional)."""
    models = _model_counters(await control.statistics())
    text = await fetch_metrics(metrics_url) if metrics_url else None
    if text is None:
        return Snapshot(models)
    values, types = parse_prometheus(text)
    return Snapshot(models, values, types)


class GaugeSampler:
    """Scrapes ``/metrics`` about every ``interval_s`` while a level runs, keeping each gauge's min, max and mean
    (not the values after the level has drained, which are idle). Constant memory: running sums per series."""

    def __init__(self, url: str | None, interval_s: float = 1.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self._stats: dict[str, list[float]] = {}  # series -> [min, max, sum, count]
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.url is not None:
            self._task = asyncio.ensure_future(self._run(self.url))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self, url: str) -> None:
        await asyncio.sleep(min(0.25, self.interval_s))
        while True:
            text = await fetch_metrics(url, timeout_s=self.interval_s)
            if text is not None:
                self._add(text)
            await asyncio.sleep(self.interval_s)

    def _add(self, text: str) -> None:
        values, types = parse_prometheus(text)
        for series, value in values.items():
            if types.get(series.split("{", 1)[0]) != "gauge":
                continue
            stats = self._stats.get(series)
            if stats is None:
                self._stats[series] = [value, value, value, 1]
            else:
                stats[0], stats[1] = min(stats[0], value), max(stats[1], value)
                stats[2] += value
                stats[3] += 1

    def summary(self) -> dict[str, dict[str, float]]:
        """Per gauge series: ``min``, ``mean``, ``max`` and the number of ``samples``."""
        return {
            series: {"min": low, "mean": total / count, "max": high, "samples": int(count)}
            for series, (low, high, total, count) in sorted(self._stats.items())
        }


def _ms(ns: int, count: int) -> float | None:
    return ns / count / 1e6 if count > 0 else None


def server_delta(
    before: Snapshot, after: Snapshot, gauges: dict[str, dict[str, float]] | None = None
) -> dict[str, Any]:
    """What the server did between two snapshots: per model, requests and average times per request (ms);
    the Prometheus counters that moved; and ``gauges`` (from a :class:`GaugeSampler`) as they were sampled."""
    models: dict[str, Any] = {}
    for name, end in after.models.items():
        start = before.models.get(name, {})
        d = {key: value - start.get(key, 0) for key, value in end.items()}
        if not (d["success_count"] or d["fail_count"]):
            continue
        compute_ns = d["compute_input_ns"] + d["compute_infer_ns"] + d["compute_output_ns"]
        models[name] = {
            "requests": d["success_count"],
            "failed": d["fail_count"],
            "executions": d["execution_count"],
            "avg_batch": d["inference_count"] / d["execution_count"] if d["execution_count"] else None,
            "avg_request_ms": _ms(d["success_ns"], d["success_count"]),
            "avg_queue_ms": _ms(d["queue_ns"], d["queue_count"]),
            "avg_compute_ms": _ms(compute_ns, d["compute_infer_count"]),
            "avg_compute_infer_ms": _ms(d["compute_infer_ns"], d["compute_infer_count"]),
        }
    delta: dict[str, Any] = {"models": models, "metrics": None}
    if before.metrics is not None and after.metrics is not None:
        counters: dict[str, float] = {}
        for series, value in after.metrics.items():
            kind = after.metric_types.get(series.split("{", 1)[0])
            if kind == "counter" and value != before.metrics.get(series, 0.0):
                counters[series] = value - before.metrics.get(series, 0.0)
        delta["metrics"] = {"counters": counters, "gauges": gauges or {}}
    return delta
