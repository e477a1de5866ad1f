"""``trtdeploy quickstart``: build, serve and benchmark the default model end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._options import JsonOpt, parse_int_list
from ._output import emit_json, err, out


def quickstart(
    *,
    model: Annotated[str, typer.Option(help="Model to run.")] = "qwen_llm",
    gpu: Annotated[str | None, typer.Option(help="GPU profile, auto (default) or cpu.")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency", "-c", help="Concurrency levels, e.g. 1,2,4.")] = "1,2,4",
    root: Annotated[Path, typer.Option(help="Folder for checkpoints, deployments and reports.")] = Path("quickstart"),
    json: JsonOpt = False,
) -> None:
    """Download (or, offline, generate) a checkpoint, build it, serve it, benchmark it, and stop the server."""
    levels = parse_int_list(concurrency, name="--concurrency")
    from .. import quickstart as job
    from ..perf.report import LiveProgress, print_table

    settings = job.QuickstartSettings(model=model, gpu=gpu, concurrency=tuple(levels), root=root)
    result = job.run(settings, say=lambda line: err.print(line, soft_wrap=True), progress=LiveProgress(err))
    summary = {**result.perf.summary, "random_weights": result.random_weights}
    if json:
        emit_json(summary)
        return
    label = "random weights: the text is noise, the timings are real" if result.random_weights else "Hub weights"
    out.print(f"[bold]{model}[/] on {result.deployment.point.gpu} ({label})")
    print_table(out, result.perf.summary)
    out.print(f"reports: {result.perf.output_dir}")
