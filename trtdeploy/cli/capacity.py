"""``trtdeploy capacity``: the replicas, GPUs and pods a target request rate needs under an SLO, from measured
curves, with the fleet simulated behind load balancers."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape

from ._options import JsonOpt
from ._output import emit_json, out


class Balancing(str, Enum):
    round_robin = "round-robin"
    least_requests = "least-requests"
    random = "random"


def capacity(
    *,
    perf: Annotated[
        Path | None, typer.Option("--perf", help="A run folder written by `trtdeploy perf` (one replica measured).")
    ] = None,
    sweep: Annotated[
        Path | None,
        typer.Option(help="A `trtdeploy sweep` folder: each measured point planned, the fewest GPUs chosen."),
    ] = None,
    target_rate: Annotated[float, typer.Option(help="The load to plan for, in requests/s.", show_default=False)],
    slo: Annotated[
        str | None,
        typer.Option(
            help="Limits as perf takes them, e.g. 'ttft_ms<=500,e2e_ms_p99<=4000' (default: the SLO the run was "
            "measured against)."
        ),
    ] = None,
    attainment: Annotated[
        float | None, typer.Option(help="--slo: the share of requests that must meet every per-request limit.")
    ] = None,
    headroom: Annotated[
        float, typer.Option(help="The share of each replica's throughput under the SLO kept spare (0 to <1).")
    ] = 0.2,
    balancing: Annotated[
        list[Balancing] | None,
        typer.Option(
            help="Balancers to simulate, repeatable: round-robin, least-requests, random (kube-proxy's iptables "
            "mode). Every one must meet the SLO. Default: round-robin and least-requests."
        ),
    ] = None,
    duration: Annotated[
        float,
        typer.Option(help="Seconds of simulated load (rate × duration at most 10 million requests per simulation)."),
    ] = 3600.0,
    arrival: Annotated[
        Literal["poisson", "gamma", "constant"],
        typer.Option(help="How simulated requests are spaced, as perf's open loop (see --burstiness)."),
    ] = "poisson",
    burstiness: Annotated[
        float, typer.Option(min=0.01, help="--arrival gamma: the gaps' shape; below 1 burstier than Poisson.")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the simulated arrivals and draws.")] = 0,
    gpus_per_replica: Annotated[
        int | None,
        typer.Option(min=1, help="GPUs of one replica (default: those of the build the run records)."),
    ] = None,
    gpus_per_node: Annotated[
        int,
        typer.Option(
            min=1, help="GPUs of one node: a replica takes ceil(its GPUs / this) pods, one per node it spans."
        ),
    ] = 8,
    output_dir: Annotated[
        Path | None, typer.Option(help="Also write capacity.json and capacity.csv (one row per point and balancer).")
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Plan capacity for a target request rate: the fewest replicas of the measured deployment whose simulated
    fleet meets --slo behind each balancer, their GPUs and pods, the latencies simulated, and the HPA target per
    replica that keeps --headroom."""
    from ..capacity import Load, plan_runs
    from ..capacity.report import capacity_table, write_files
    from ..errors import UsageError
    from ..perf.report import print_wide
    from ..perf.slo import Slo
    from ..server import stop_signals_as_interrupt
    from ._output import err

    if (perf is None) == (sweep is None):
        raise UsageError("pass one of --perf RUN_DIR and --sweep SWEEP_DIR", hint="e.g. --perf perf-results/<run>/")
    if attainment is not None and slo is None:
        raise UsageError("--attainment is the share of requests that must meet --slo", hint="pass --slo too")
    names = [each.value for each in balancing] if balancing else ["round-robin", "least-requests"]
    with stop_signals_as_interrupt():  # SIGTERM stops the simulation workers as Ctrl-C does
        result = plan_runs(
            [perf or sweep],  # type: ignore[list-item]
            target_rate,
            slo=Slo.parse(slo, attainment) if slo is not None else None,
            balancing=tuple(dict.fromkeys(names)),
            headroom=headroom,
            load=Load(target_rate, duration, arrival, burstiness, seed),
            gpus_per_replica=gpus_per_replica,
            gpus_per_node=gpus_per_node,
            say=lambda line: err.print(escape(line)),
        )
    written = write_files(result, output_dir) if output_dir is not None else []
    if json:
        emit_json({**result.to_dict(), "files": [str(path) for path in written]})
        return
    print_wide(out, capacity_table(result))
    if output_dir is not None:
        out.print(f"written: {output_dir}")
