"""``trtdeploy report``: perf runs side by side, as a table, CSV/markdown files and overlaid plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._options import JsonOpt
from ._output import emit_json, out, warn


def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="Run folders written by `trtdeploy perf`, each holding a summary.json, or `trtdeploy sweep` folders "
            "(their measured points' runs); all of one workload family (LLM, TTS or ASR).",
            show_default=False,
        ),
    ],
    *,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="A run's name in the table and plots, once per run in the order of RUN_DIRS (default: model, "
            "engine, precision and GPU of its deployment, else the folder's name).",
        ),
    ] = None,
    output_dir: Annotated[
        Path | None, typer.Option(help="Where the report goes (default: perf-results/report-<timestamp>/).")
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Write the throughput and latency plots.")] = True,
    json: JsonOpt = False,
) -> None:
    """Compare perf runs: one row per run and level (throughput, latency percentiles, SLO attainment), plots with
    one line per run, written as report.csv, report.md, report.json and PNGs."""
    from ..errors import UsageError
    from ..fsutil import prepare_output_dir, remove_empty
    from ..perf.compare import compare, comparison_table, write_report
    from ..perf.report import default_output_dir, print_wide

    comparison = compare(run_dirs, label)
    folder = output_dir or default_output_dir("report")
    if any(folder.resolve() == run.path.resolve() for run in comparison.runs):
        raise UsageError(
            f"--output-dir {folder} is one of the runs: the report's plots would replace the run's own",
            hint="pass another folder, e.g. --output-dir compare/",
        )
    created = prepare_output_dir(folder)
    try:
        written = write_report(comparison, folder, plots=plots, warn=warn)
    except BaseException:
        remove_empty(created)  # a folder made for this report goes again if nothing was written into it
        raise
    if json:
        emit_json({**comparison.to_dict(), "output_dir": str(folder), "files": [str(path) for path in written]})
        return
    print_wide(out, comparison_table(comparison))
    out.print(f"report: {folder}")
