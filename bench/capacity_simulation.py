"""How long ``trtdeploy capacity`` takes to plan and simulate 100 replicas for an hour of load (round-robin and
least-requests), on a synthetic LLM-like curve: requests take 1 s alone and 4 s at 64 in flight (gamma spread),
levels 1 to 64. With no headroom (the default) the throughput's 100 replicas run at 100% and miss the SLO, so the
replica search runs. Prints the seconds, the replica counts simulated, the requests and the plan; asserts nothing."""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from trtdeploy.capacity import Load, MeasuredLevel, ReplicaCurve, plan
from trtdeploy.perf.slo import Slo


def curve(slo: str) -> ReplicaCurve:
    rng = np.random.default_rng(0)
    levels = []
    for concurrency in (1, 2, 4, 8, 16, 32, 64):
        mean_s = 1.0 + 3.0 * concurrency / 64
        e2e = rng.gamma(4, mean_s / 4, 2000)
        rows = [{"e2e_ms": x * 1e3, "ttft_ms": 50 + 4 * concurrency, "error": None} for x in e2e]
        levels.append(MeasuredLevel(concurrency, None, concurrency / mean_s, rows))
    return ReplicaCurve.from_levels("llm-like", Slo.parse(slo), levels, gpus=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=100)
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--slo", default="e2e_ms_p99<=5000")
    parser.add_argument("--headroom", type=float, default=0.0)
    args = parser.parse_args()
    measured = curve(args.slo)
    rate = args.replicas * measured.best.throughput * (1 - args.headroom)  # exactly the replicas asked for
    started = time.perf_counter()
    found = plan(measured, rate, headroom=args.headroom, load=Load(rate, duration_s=args.duration))
    took = time.perf_counter() - started
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_version()}")
    print(f"target {rate:.0f} req/s, {args.duration:g} s simulated")
    print(f"  counts scouted on a shorter load: {found.scouted}")
    print(f"  counts simulated on the whole load: {found.tried}")
    for simulated in found.simulated:
        e2e = simulated.percentiles["e2e_ms"]
        print(
            f"  {simulated.balancing}: {simulated.requests:,} requests, E2E p50/p99 {e2e['p50']:.0f}/{e2e['p99']:.0f} "
            f"ms, SLO {'met' if simulated.slo_met else 'missed'}"
        )
    print(f"plan + simulation of {found.replicas} replicas: {took:.1f} s")


if __name__ == "__main__":
    main()
