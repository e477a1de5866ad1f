"""``trtdeploy build``: checkpoint → engine → rendered, validated model repository."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from .. import build as builder
from ..errors import UsageError
from ..matrix import Matrix, parse_lengths, plan_all
from ._options import JsonOpt, ModelArg, parse_int_list, parse_key_values
from ._output import emit_json, err, out, warn


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
        str | None,
        typer.Option(help="Target GPU profile (`trtdeploy gpus`) with optional :COUNT (H100:8), auto or cpu."),
    ] = None,
    precision: Annotated[
        str | None, typer.Option(help="Weights precision(s), comma-separated (default: the engine's best).")
    ] = None,
    max_batch_size: Annotated[
        str | None, typer.Option(help="Requests served together, comma-separated (default: the GPU profile's).")
    ] = None,
    tp: Annotated[str, typer.Option("--tp", help="Tensor-parallel size(s), comma-separated.")] = "1",
    pp: Annotated[str, typer.Option("--pp", help="Pipeline-parallel size(s), comma-separated.")] = "1",
    replicas: Annotated[
        int, typer.Option(help="Copies of the model behind one endpoint, each on TP x PP GPUs of its own.")
    ] = 1,
    isl_osl: Annotated[
        str | None, typer.Option("--isl-osl", help="INPUT:OUTPUT token limits, comma-separated (2048:1024,...).")
    ] = None,
    mode: Annotated[str, typer.Option(help="offline or streaming (decoupled).")] = "streaming",
    max_input_len: Annotated[int | None, typer.Option(help="Longest prompt in tokens.")] = None,
    max_output_len: Annotated[int | None, typer.Option(help="Most tokens generated per request.")] = None,
    max_num_tokens: Annotated[
        int | None, typer.Option(help="Tokens one engine step may process (default: the GPU profile's).")
    ] = None,
    trtllm_version: Annotated[
        str | None, typer.Option(help="TensorRT-LLM release to plan for (default: the installed one).")
    ] = None,
    kv_cache_dtype: Annotated[
        str | None,
        typer.Option(
            help="KV-cache type: fp8 (SM89+) or int8 (default: fp8 for --precision fp8, else 16-bit); trtllm."
        ),
    ] = None,
    calib_dataset: Annotated[
        Path | None,
        typer.Option(help="Local dataset folder to calibrate on (default: quantize.py's, from the Hub); trtllm."),
    ] = None,
    calib_size: Annotated[
        int | None, typer.Option(help="Calibration samples (default: 32 for int4_awq, else 512); trtllm.")
    ] = None,
    model_dir: Annotated[
        Path | None, typer.Option(help="Use this local checkpoint folder instead of downloading.")
    ] = None,
    revision: Annotated[str | None, typer.Option(help="Hub revision to download.")] = None,
    output_dir: Annotated[Path, typer.Option(help="Root of the deployment folders.")] = Path("deployments"),
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Model or engine setting KEY=VALUE (repeatable).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan of every point; touch nothing.")] = False,
    skip_invalid: Annotated[
        bool, typer.Option("--skip-invalid", help="Build the valid points of a matrix and list the others.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when the deployment is up to date.")] = False,
    json: JsonOpt = False,
) -> None:
    """Build deployments of MODEL, one per matrix point: checkpoint, engines, Triton model repository, manifest."""
    requests = matrix_requests(locals())
    plans, rejected = plan_all(requests, dry_run=dry_run, skip_invalid=skip_invalid)
    for item in rejected:
        warn(f"skipped {item.label}: {item.reason}")
    if dry_run:
        described = [found.describe() for found in plans]
        if json:
            extra = {"rejected": [{"point": r.label, "reason": r.reason} for r in rejected]} if rejected else {}
            emit_json(
                {"dry_run": True, **described[0]}
                if len(requests) == 1
                else {"dry_run": True, "points": described, **extra}
            )
        else:
            for number, item in enumerate(described, 1):
                if len(described) > 1:
                    out.rule(f"point {number} of {len(described)}: {Path(item['deployment']).name}")
                _print_plan(item)
        return
    summaries = [_build_one(found, force, number, len(plans)) for number, found in enumerate(plans, 1)]
    if json:
        emit_json(summaries[0] if len(requests) == 1 else {"deployments": summaries})
        return
    for summary in summaries:
        verb = "is up to date" if summary["up_to_date"] else f"built in {summary['seconds']} s"
        out.print(f"[green]✓[/] {summary['deployment']} {verb}")
        out.print(f"  models: {', '.join(summary['triton_models'])} (entry: {summary['entry_model']})")
    out.print(f"  next:   trtdeploy serve {summaries[-1]['deployment']}")


def matrix_requests(options: Mapping[str, Any]) -> list[builder.BuildRequest]:
    """The build request of every matrix point that ``build``'s options (by parameter name) ask for; ``sweep``
    passes the same options."""
    isl_osl, max_input_len, max_output_len = options["isl_osl"], options["max_input_len"], options["max_output_len"]
    if isl_osl and (max_input_len or max_output_len):
        raise UsageError("--isl-osl sets the lengths of every point", hint="drop --max-input-len/--max-output-len")
    base = builder.BuildRequest(
        model=options["model"],
        engine=options["engine"],
        gpu=options["gpu"],
        mode=options["mode"],
        max_input_len=max_input_len,
        max_output_len=max_output_len,
        max_num_tokens=options["max_num_tokens"],
        engine_version=options["trtllm_version"],
        kv_cache_dtype=options["kv_cache_dtype"],
        calib_dataset=options["calib_dataset"],
        calib_size=options["calib_size"],
        replicas=options["replicas"],
        model_dir=options["model_dir"],
        revision=options["revision"],
        output_root=options["output_dir"],
        options=parse_key_values(options["option"] or [], name="--option"),
    )
    precision, max_batch_size = options["precision"], options["max_batch_size"]
    grid = Matrix(
        precisions=tuple(precision.split(",")) if precision else (None,),
        max_batch_sizes=tuple(parse_int_list(max_batch_size, name="--max-batch-size")) if max_batch_size else (None,),
        tps=tuple(parse_int_list(options["tp"], name="--tp")),
        pps=tuple(parse_int_list(options["pp"], name="--pp")),
        lengths=parse_lengths(isl_osl) if isl_osl else ((None, None),),
    )
    return grid.points(base)


def _build_one(found: builder.Plan, force: bool, number: int, total: int) -> dict:
    started = time.monotonic()
    prefix = f"[{number}/{total}] {found.point.name}: " if total > 1 else ""
    with err.status(f"{prefix}building ...") as status:
        result = builder.execute(found, force=force, on_step=lambda text: status.update(f"{prefix}{text} ..."))
    deployment = result.deployment
    return {
        "deployment": str(deployment.path),
        "up_to_date": result.up_to_date,
        "entry_model": deployment.entry_model,
        "triton_models": deployment.models,
        "seconds": round(time.monotonic() - started, 2),
    }


def _print_plan(plan: dict) -> None:
    table = Table("", "", show_header=False, box=None)
    table.add_row("model", plan["model"])
    table.add_row("deployment", plan["deployment"])
    table.add_row("checkpoint", plan["checkpoint"])
    for key, value in plan["point"].items():
        if key != "model" and value not in ("", None):
            table.add_row(key, str(value))
    out.print(table)
    out.print("[bold]steps[/]")
    for step in plan["steps"]:
        command = " ".join(step["command"]) if step["command"] else "(in-process)"
        out.print(f"  {step['name']}: {command}", markup=False)
    out.print(f"  render: model_repo/ (entry model: {plan['entry_model']})")
    for name in plan["files"]:
        out.print(f"    {name}")
    if plan["notes"]:
        out.print("[bold]notes[/]")
        for note in plan["notes"]:
            out.print(f"  - {note}", markup=False)
