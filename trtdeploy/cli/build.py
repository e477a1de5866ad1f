"""``trtdeploy build``: checkpoint → engine → rendered, validated model repository."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .. import build as builder
from ._options import JsonOpt, ModelArg, parse_key_values
from ._output import emit_json, err, out


def build(
    model: ModelArg,
    *,
    engine: Annotated[
        str,
        typer.Option(
            help="Engine serving the LLM (installed ones: `trtdeploy plugins`); auto: the best one usable here "
            "(trtllm, then trtllm_pytorch, then torch)."
        ),
    ] = "auto",
    gpu: Annotated[
        str | None, typer.Option(help="Target GPU profile (L4, H100, ... with optional :COUNT), auto or cpu.")
    ] = None,
    precision: Annotated[str | None, typer.Option(help="Weights precision (default: the engine's best).")] = None,
    max_batch_size: Annotated[int, typer.Option(help="Requests served together.")] = 8,
    mode: Annotated[str, typer.Option(help="offline or streaming (decoupled).")] = "streaming",
    max_input_len: Annotated[int | None, typer.Option(help="Longest prompt in tokens.")] = None,
    max_output_len: Annotated[int | None, typer.Option(help="Most tokens generated per request.")] = None,
    model_dir: Annotated[
        Path | None, typer.Option(help="Use this local checkpoint folder instead of downloading.")
    ] = None,
    revision: Annotated[str | None, typer.Option(help="Hub revision to download.")] = None,
    output_dir: Annotated[Path, typer.Option(help="Root of the deployment folders.")] = Path("deployments"),
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Model setting KEY=VALUE (repeatable).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; touch nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when the deployment is up to date.")] = False,
    json: JsonOpt = False,
) -> None:
    """Build a deployment of MODEL: one folder with its checkpoint, engines, Triton model repository and manifest."""
    request = builder.BuildRequest(
        model=model,
        engine=engine,
        gpu=gpu,
        precision=precision,
        max_batch_size=max_batch_size,
        mode=mode,  # type: ignore[arg-type]
        max_input_len=max_input_len,
        max_output_len=max_output_len,
        model_dir=model_dir,
        revision=revision,
        output_root=output_dir,
        options=parse_key_values(option or [], name="--option"),
    )
    if dry_run:
        described = builder.plan(request).describe()
        if json:
            emit_json({"dry_run": True, **described})
        else:
            _print_plan(described)
        return
    started = time.monotonic()
    with err.status("building ...") as status:
        result = builder.run(request, force=force, on_step=lambda text: status.update(f"{text} ..."))
    deployment = result.deployment
    summary = {
        "deployment": str(deployment.path),
        "up_to_date": result.up_to_date,
        "entry_model": deployment.entry_model,
        "triton_models": deployment.models,
        "seconds": round(time.monotonic() - started, 2),
    }
    if json:
        emit_json(summary)
        return
    verb = "is up to date" if result.up_to_date else f"built in {summary['seconds']} s"
    out.print(f"[green]✓[/] {deployment.path} {verb}")
    out.print(f"  models: {', '.join(deployment.models)} (entry: {deployment.entry_model})")
    out.print(f"  next:   trtdeploy serve {deployment.path}")


def _print_plan(plan: dict) -> None:
    table = Table("", "", show_header=False, box=None)
    table.add_row("model", plan["model"])
    table.add_row("deployment", plan["deployment"])
    table.add_row("checkpoint", plan["checkpoint"])
    for key, value in plan["point"].items():
        if key != "model":
            table.add_row(key, str(value))
    out.print(table)
    out.print("[bold]steps[/]")
    for step in plan["steps"]:
        command = " ".join(step["command"]) if step["command"] else "(in-process)"
        out.print(f"  {step['name']}: {command}")
    out.print(f"  render: model_repo/ (entry model: {plan['entry_model']})")
    for name in plan["files"]:
        out.print(f"    {name}")
