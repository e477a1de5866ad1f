"""``trtdeploy sweep``: build, serve and benchmark every point of a build matrix, then report them side by side.

It takes ``build``'s matrix options and ``perf``'s load, input and SLO options, under the same names and with the
same help (:func:`_with_options` adds them to its signature), so a sweep is asked for the way its parts are.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from copy import copy
from pathlib import Path
from typing import Annotated, Any

import typer

from ._options import JsonOpt, ModelArg
from ._output import emit_json, err, out, warn
from .build import build, matrix_requests
from .perf import perf, perf_settings

#: ``build`` options a sweep does not take: what it decides itself (every point is listed, failed ones too).
BUILD_OPTIONS_LEFT_OUT = ("model", "dry_run", "skip_invalid", "json")
#: ``perf`` options a sweep does not take (they keep perf's defaults): the sweep serves each point's deployment
#: itself on Triton (its workload and tokenizer are the deployment's) and names its runs' folders.
PERF_OPTIONS_LEFT_OUT = (
    *("deployment", "url", "metrics_url", "model", "output_dir", "json"),
    *("endpoint", "api", "tokenizer", "extra_body", "workload"),
)
#: ``build``'s --output-dir (the deployments' root) is --deployments-dir here: --output-dir is the sweep's folder.
RENAMED = {"output_dir": ("deployments_dir", "--deployments-dir")}


def sweep(
    model: ModelArg,
    *,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            help="The sweep's folder: sweep.json, each point's perf run under runs/, the report (default: "
            "perf-results/sweep-MODEL/). Run the same command again on it to measure only what is missing."
        ),
    ] = None,
    serve_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for each point's server and its models.")
    ] = 180.0,
    tritonserver: Annotated[
        Path | None,
        typer.Option(help="tritonserver binary (default: PATH, /opt/tritonserver, then the nvidia-pytriton one)."),
    ] = None,
    json: JsonOpt = False,
    **options: Any,
) -> None:
    """Build, serve and benchmark every point of a build matrix (precisions x batch sizes x TP x PP x lengths), one
    after another, then report them: a table, a Pareto plot of throughput per GPU against per-user latency, and the
    best point under --slo. A point that fails is reported with its reason; the others go on."""
    from ..perf.report import LiveProgress, print_wide
    from ..server import stop_signals_as_interrupt
    from ..sweep import SweepSettings, run_sweep

    build_options = {name: options[name] for name in _parameters(build) if name in options}
    build_options.update(model=model, output_dir=options["deployments_dir"])
    perf_options = {name: options.get(name, param.default) for name, param in _parameters(perf).items()}
    settings = SweepSettings(
        points=tuple(matrix_requests(build_options)),
        perf=perf_settings(perf_options),
        output_dir=output_dir or Path("perf-results") / f"sweep-{model}",
        force_build=options["force"],
        serve_timeout=serve_timeout,
        tritonserver=tritonserver,
        max_error_rate=options["max_error_rate"],
    )
    with stop_signals_as_interrupt(), LiveProgress(err) as progress:
        result = run_sweep(settings, say=lambda line: err.print(line, markup=False), progress=progress, warn=warn)
    if json:
        emit_json({**result.to_dict(), "output_dir": str(result.output_dir), "files": [str(p) for p in result.files]})
        return
    print_wide(out, _points_table(result))
    out.print(f"report: {result.output_dir}")


def _points_table(result: Any) -> Any:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from ..sweep import points_table

    headers, rows, notes = points_table(result)
    table = Table(title=f"sweep: {len(rows)} points", box=box.SIMPLE_HEAD)
    for index, header in enumerate(headers):
        table.add_column(header, justify="left" if index < 2 or header == "note" else "right")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    table.caption = escape("; ".join(notes))
    return table


def _parameters(command: Callable[..., None]) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(command, eval_str=True).parameters)


def _with_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with build's and perf's options (less those left out, build's --output-dir renamed) added to its
    signature, where typer reads its options from, each group under a heading of its own in --help: their values
    reach ``command`` in ``**options``."""
    own = [param for param in _parameters(command).values() if param.kind is not inspect.Parameter.VAR_KEYWORD]
    added: dict[str, inspect.Parameter] = {}
    for source, left_out, panel in (
        (build, BUILD_OPTIONS_LEFT_OUT, "Build matrix (as trtdeploy build)"),
        (perf, PERF_OPTIONS_LEFT_OUT, "Benchmark of each point (as trtdeploy perf)"),
    ):
        for name, param in _parameters(source).items():
            if name in left_out:
                continue
            base, info = param.annotation.__origin__, copy(param.annotation.__metadata__[0])
            info.rich_help_panel = panel
            if source is build and name in RENAMED:
                name, flag = RENAMED[name]
                info.param_decls = (flag,)
            if name in added or any(name == each.name for each in own):
                raise TypeError(f"sweep: option {name!r} is taken twice")  # a programming error, caught by the tests
            annotation = Annotated[base, info]
            added[name] = param.replace(name=name, annotation=annotation, kind=inspect.Parameter.KEYWORD_ONLY)
    command.__signature__ = inspect.Signature([*own, *added.values()])  # type: ignore[attr-defined]
    return command


sweep = _with_options(sweep)
