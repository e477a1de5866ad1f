"""What ``trtdeploy capacity`` shows and writes: one row per planned point and balancer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fsutil import atomic_write_text, prepare_output_dir
from ..perf.report import METRIC_NAMES, format_number, format_percent, write_csv
from .plan import SweepPlan

if TYPE_CHECKING:
    from rich.table import Table

CAPACITY_JSON = "capacity.json"
CAPACITY_CSV = "capacity.csv"
#: The latencies shown, those a curve has, in this order.
SHOWN = ("ttft_ms", "first_chunk_ms", "first_partial_ms", "e2e_ms")


def rows(result: SweepPlan) -> list[dict[str, Any]]:
    """One row per point and balancer: the plan's numbers and the simulated ones."""
    found = []
    for each in result.plans:
        for simulated in each.simulated:
            row: dict[str, Any] = {
                "point": each.label,
                "replicas": each.replicas,
                "gpus": each.gpus,
                "pods": each.pods,
                "slots": each.slots,
                "replica_throughput": each.replica_throughput,
                "balancing": simulated.balancing,
                "requests": simulated.requests,
                "wait_ms_mean": simulated.wait_ms["mean"],
                "wait_ms_p99": simulated.wait_ms["p99"],
            }
            for metric, stats in simulated.percentiles.items():
                row.update((f"{metric}_{stat}", value) for stat, value in stats.items())
            row.update(
                attainment=simulated.attainment,
                slo_met=simulated.slo_met,
                in_flight=simulated.in_flight,
                hpa_target=each.hpa.in_flight,
                hpa_headroom=simulated.hpa_headroom,
            )
            found.append(row)
    return found


def capacity_table(result: SweepPlan) -> Table:
    """The console table: per point, its replicas, GPUs and pods, and per balancer the simulated latencies."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    first = result.plans[0]
    metrics = [m for m in SHOWN if any(m in s.percentiles for each in result.plans for s in each.simulated)]
    title = f"capacity for {first.target_rate:g} req/s under {first.slo} ({first.headroom:.0%} headroom)"
    table = Table(title=escape(title), box=box.SIMPLE_HEAD)
    headers = ["point", "replicas", "GPUs", "pods", "balancing", "wait p99"]
    headers += [f"{METRIC_NAMES[m]} p50/p90/p99" for m in metrics] + ["SLO", "in flight / HPA target"]
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index in (0, 4) else "right")
    best = result.best
    for each in result.plans:
        for index, simulated in enumerate(each.simulated):
            cells = [escape(each.label), str(each.replicas), str(each.gpus), str(each.pods)] if index == 0 else [""] * 4
            cells += [simulated.balancing, format_number(simulated.wait_ms["p99"])]
            for metric in metrics:
                stats = simulated.percentiles.get(metric, {})
                cells.append("/".join(format_number(stats.get(f"p{p}")) for p in (50, 90, 99)))
            attained = "" if simulated.attainment is None else format_percent(simulated.attainment) + " "
            cells.append(attained + ("✓" if simulated.slo_met else "✗"))
            cells.append(f"{format_number(simulated.in_flight)} / {format_number(each.hpa.in_flight)}")
            table.add_row(*cells, style="bold" if each is best and len(result.plans) > 1 else None)
        table.add_section()
    notes = [
        "latencies in ms, simulated",
        f"a replica serves up to {first.slots} requests at once (measured level {first.level}: "
        f"{format_number(first.replica_throughput)} req/s)",
        f"HPA target: {format_number(first.hpa.in_flight)} requests in flight per replica",
        f"pods: {first.pods_per_replica} per replica of {first.gpus_per_replica} GPUs "
        "(ceil(GPUs per replica / GPUs per node): one per node it spans)",
    ]
    if len(result.plans) > 1:
        notes.append("bold: the fewest GPUs")
    notes += [f"{label}: {reason}" for label, reason in result.excluded.items()]
    table.caption = escape("; ".join(notes))
    return table


def write_files(result: SweepPlan, output_dir: Path) -> list[Path]:
    """capacity.json (the plans) and capacity.csv (:func:`rows`) in ``output_dir``."""
    prepare_output_dir(output_dir)
    data_path, csv_path = output_dir / CAPACITY_JSON, output_dir / CAPACITY_CSV
    atomic_write_text(data_path, json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    write_csv(csv_path, rows(result))
    return [data_path, csv_path]
