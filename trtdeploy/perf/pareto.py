"""What a sweep's points give per GPU: every measured level as (per-user latency, throughput per GPU), the Pareto
frontier of those, the best level under the SLO, and the plot of them all (``trtdeploy sweep``'s report).

Throughput per GPU is a level's throughput (LLMs: output tokens/s; speech: audio seconds per second) divided by the
GPUs its deployment holds (TP x PP x replicas). A level is on the frontier when no other level has both a lower
latency and a higher throughput per GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .compare import FAMILIES, Comparison, run_colors
from .report import METRIC_NAMES, level_text, level_value, pyplot, save_figure, stat_of

PARETO_PNG = "pareto.png"

#: The per-user latencies each family's frontier is drawn against (metric, percentile), one plot panel each.
LATENCY_AXES: dict[str, tuple[tuple[str, str], ...]] = {
    "llm": (("itl_ms", "p50"), ("ttft_ms", "p90")),
    "tts": (("first_chunk_ms", "p90"), ("rtf", "p95")),
    "asr": (("e2e_ms", "p90"), ("first_partial_ms", "p90")),
}


@dataclass(frozen=True)
class Level:
    """One measured level of one sweep point."""

    run: int  # the point's index among the comparison's runs
    summary: dict[str, Any]
    throughput_per_gpu: float | None

    @property
    def met_slo(self) -> bool:
        return bool(self.summary["slo_met"]) and self.summary["status"] == "complete"


def levels_of(comparison: Comparison, gpus: Sequence[int]) -> list[Level]:
    """Every level of every run, with its throughput divided by ``gpus`` (one count per run)."""
    throughput = FAMILIES[comparison.family].throughput
    levels = []
    for index, run in enumerate(comparison.runs):
        for summary in run.summary["levels"]:
            value = throughput.value(summary)
            levels.append(Level(index, summary, None if value is None else value / gpus[index]))
    return levels


def frontier(levels: Sequence[Level], metric: str, stat: str) -> list[Level]:
    """The levels that no other level beats in both ``metric``'s ``stat`` (lower) and throughput per GPU (higher),
    by latency; levels without either value take no part."""
    known = [
        level
        for level in levels
        if level.throughput_per_gpu is not None and stat_of(level.summary, metric, stat) is not None
    ]
    known.sort(key=lambda level: (stat_of(level.summary, metric, stat), -level.throughput_per_gpu))  # type: ignore[operator]
    best: list[Level] = []
    for level in known:
        if not best or level.throughput_per_gpu > best[-1].throughput_per_gpu:  # type: ignore[operator]
            best.append(level)
    return best


def best_level(levels: Sequence[Level], *, slo: bool) -> Level | None:
    """The level with the most throughput per GPU among those that met the SLO (``slo``), or among all complete
    levels without one; None when no level qualifies."""
    eligible = [
        level
        for level in levels
        if level.throughput_per_gpu is not None and (level.met_slo if slo else level.summary["status"] == "complete")
    ]
    return max(eligible, key=lambda level: level.throughput_per_gpu, default=None)  # type: ignore[arg-type,return-value]


def write_pareto_plot(
    comparison: Comparison, levels: Sequence[Level], best: Level | None, output_dir: Path, *, slo: bool
) -> Path:
    """One panel per latency of :data:`LATENCY_AXES`: each point's levels in its colour (filled where the level met
    the SLO, hollow where it did not) labelled with their concurrency or rate, the frontier as a black step line, the
    best level starred."""
    plt = pyplot()
    family = FAMILIES[comparison.family]
    axes_spec = LATENCY_AXES[comparison.family]
    colors = run_colors(len(comparison.runs))
    figure, axes = plt.subplots(1, len(axes_spec), figsize=(7 * len(axes_spec), 5.2), squeeze=False)
    for axis, (metric, stat) in zip(axes[0], axes_spec, strict=True):
        for index in range(len(comparison.runs)):
            own = [level for level in levels if level.run == index and stat_of(level.summary, metric, stat) is not None]
            own.sort(key=lambda level: level_value(level.summary))  # the line goes the way the load rises
            xs = [stat_of(level.summary, metric, stat) for level in own]
            ys = [level.throughput_per_gpu for level in own]
            axis.plot(xs, ys, "-", color=colors[index], alpha=0.5, label=comparison.shown_label(index))
            for level, x, y in zip(own, xs, ys, strict=True):
                filled = level.met_slo or not slo
                axis.plot(x, y, "o", color=colors[index], markerfacecolor=colors[index] if filled else "none")
                axis.annotate(level_text(level.summary), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
        edge = frontier(levels, metric, stat)
        if edge:
            xs = [stat_of(level.summary, metric, stat) for level in edge]
            axis.step(xs, [level.throughput_per_gpu for level in edge], "k--", where="post", lw=1, label="frontier")
        if best is not None and stat_of(best.summary, metric, stat) is not None:
            x = stat_of(best.summary, metric, stat)
            axis.plot(x, best.throughput_per_gpu, "*", color="gold", markeredgecolor="k", markersize=16, label="best")
        unit = "" if metric == "rtf" else " (ms)"
        axis.set(
            xlabel=f"{METRIC_NAMES[metric]} {stat}{unit}",
            ylabel=f"{family.throughput_label} per GPU",
            title=f"throughput per GPU against {METRIC_NAMES[metric]} {stat}",
        )
        axis.grid(alpha=0.3)
    note = "filled: met the SLO; hollow: missed it" if slo else "no SLO given"
    axes[0][0].legend(fontsize="small", title=note, title_fontsize="small")
    return save_figure(figure, output_dir / PARETO_PNG)
