"""The sweep report's arithmetic: throughput per GPU, the Pareto frontier, the best level under the SLO."""

from __future__ import annotations

from pathlib import Path

from trtdeploy.perf.compare import Comparison, Run
from trtdeploy.perf.pareto import best_level, frontier, levels_of


def level(concurrency: int, tokens_per_s: float, itl_p50: float, *, slo_met: bool | None = None) -> dict:
    return {
        "concurrency": concurrency,
        "request_rate": None,
        "status": "complete",
        "output_token_throughput": tokens_per_s,
        "itl_ms": {"p50": itl_p50},
        "slo_met": slo_met,
    }


def comparison(*runs: list[dict]) -> Comparison:
    return Comparison(
        "llm",
        tuple(Run(Path(f"run{index}"), {"levels": levels, "status": "complete"}) for index, levels in enumerate(runs)),
        tuple(f"point {index}" for index in range(len(runs))),
    )


def test_throughput_is_divided_by_each_points_gpus():
    levels = levels_of(comparison([level(1, 100, 5)], [level(1, 300, 5)]), gpus=[1, 2])
    assert [each.throughput_per_gpu for each in levels] == [100, 150]


def test_the_frontier_keeps_the_levels_no_other_beats_on_both_axes():
    one = [level(1, 100, 2), level(4, 300, 4), level(8, 320, 9)]
    two = [level(1, 120, 3), level(4, 250, 5), level(8, 500, 8)]
    levels = levels_of(comparison(one, two), gpus=[1, 1])
    edge = [(each.run, each.summary["concurrency"]) for each in frontier(levels, "itl_ms", "p50")]
    # (1, 4) is beaten by (0, 4): less latency and more throughput; (0, 8) by (1, 8)
    assert edge == [(0, 1), (1, 1), (0, 4), (1, 8)]


def test_the_best_level_is_the_most_per_gpu_among_those_meeting_the_slo():
    one = [level(1, 100, 2, slo_met=True), level(8, 900, 9, slo_met=False)]
    two = [level(1, 300, 3, slo_met=True), level(8, 800, 8, slo_met=True)]
    levels = levels_of(comparison(one, two), gpus=[1, 2])
    best = best_level(levels, slo=True)
    assert (best.run, best.summary["concurrency"], best.throughput_per_gpu) == (1, 8, 400)
    best = best_level(levels, slo=False)  # without an SLO: the most per GPU of all
    assert (best.run, best.summary["concurrency"]) == (0, 8)
    assert best_level(levels_of(comparison([level(1, 100, 2, slo_met=False)]), gpus=[1]), slo=True) is None
