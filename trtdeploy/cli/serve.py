"""``trtdeploy serve``: start tritonserver on a deployment, wait until it is ready, print its endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..deployment import Deployment, find_latest
from ..server import ServerInfo, serve_deployment, stop_signals_as_interrupt, wait_foreground
from ._options import DeploymentArg, JsonOpt
from ._output import emit_json, err, out


def serve(
    deployment: DeploymentArg = None,
    *,
    http_port: Annotated[int | None, typer.Option(min=1, max=65535, help="HTTP port (default: a free one).")] = None,
    grpc_port: Annotated[int | None, typer.Option(min=1, max=65535, help="gRPC port (default: a free one).")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Prometheus metrics port (default: a free one).")
    ] = None,
    background: Annotated[
        bool, typer.Option("--background", "-d", help="Return once ready; stop it later with `trtdeploy stop`.")
    ] = False,
    tritonserver: Annotated[
        Path | None,
        typer.Option(help="tritonserver binary (default: PATH, /opt/tritonserver, then the nvidia-pytriton one)."),
    ] = None,
    log_file: Annotated[
        Path | None, typer.Option(help="Server log (default: <deployment>/logs/tritonserver.log).")
    ] = None,
    log_verbose: Annotated[int, typer.Option(min=0, help="tritonserver --log-verbose level.")] = 0,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for the server and its models.")] = 180.0,
    json: JsonOpt = False,
) -> None:
    """Serve a deployment with tritonserver: wait for every model, print the endpoints, run until Ctrl-C (or -d)."""
    dep = Deployment.load(deployment) if deployment is not None else find_latest()
    with stop_signals_as_interrupt():
        with err.status(f"starting tritonserver for {dep.path.name} ..."):
            server, info = serve_deployment(
                dep,
                http_port=http_port,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                tritonserver=tritonserver,
                log_file=log_file,
                log_verbose=log_verbose,
                timeout=timeout,
                background=background,
            )
        if json:
            emit_json(info.to_dict())
        else:
            _print_endpoints(info)
        if background:
            err.print(
                f"Running in the background (pid {info.pid}); stop it with `trtdeploy stop --port {info.grpc_port}`.",
                soft_wrap=True,
            )
            return
        err.print("Serving; press Ctrl-C to stop.")
        err.print(wait_foreground(server) + ".")


def _print_endpoints(info: ServerInfo) -> None:
    """One aligned line per endpoint; soft-wrapped so long paths stay whole and copyable."""
    rows = {
        "HTTP": info.http_url,
        "gRPC": info.grpc_url,
        "metrics": info.metrics_url,
        "entry model": info.entry_model,
        "models": ", ".join(info.models),
        "deployment": info.deployment,
        "log": info.log_file,
        "pid": info.pid,
    }
    out.print("[green]✓[/] tritonserver is ready")
    for label, value in rows.items():
        out.print(f"  [bold]{label:<12}[/] {escape(str(value))}", soft_wrap=True)
