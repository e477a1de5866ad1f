"""``trtdeploy serve``: start tritonserver on a deployment, wait until it is ready, print its endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..deployment import Deployment, find_latest
from ..server import (
    DEFAULT_HOST,
    DEFAULT_PORTS,
    RESTRICTABLE_APIS,
    RunningServer,
    ServerInfo,
    serve_deployment,
    startup_notes,
    stop_signals_as_interrupt,
    wait_foreground,
)
from ._options import DeploymentArg, JsonOpt
from ._output import emit_json, err, out

_PORTS = "default: Triton's {}, or the next free triple if taken"


def serve(
    deployment: DeploymentArg = None,
    *,
    http_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help=f"HTTP port ({_PORTS.format(DEFAULT_PORTS[0])}).")
    ] = None,
    grpc_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help=f"gRPC port ({_PORTS.format(DEFAULT_PORTS[1])}).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help=f"Prometheus metrics port ({_PORTS.format(DEFAULT_PORTS[2])}).")
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on: 127.0.0.1 is this machine only; 0.0.0.0 opens it to the network.")
    ] = DEFAULT_HOST,
    allow_api: Annotated[
        str | None,
        typer.Option(
            help=f"Leave these restricted APIs open to every caller: {', '.join(RESTRICTABLE_APIS)} or all "
            "(comma-separated; default: each needs the server's own header)."
        ),
    ] = None,
    background: Annotated[
        bool, typer.Option("--background", "-d", help="Return once ready; stop it later with `trtdeploy stop`.")
    ] = False,
    tritonserver: Annotated[
        Path | None,
        typer.Option(help="tritonserver binary (default: PATH, /opt/tritonserver, then the nvidia-pytriton one)."),
    ] = None,
    log_file: Annotated[
        Path | None,
        typer.Option(help="Server log (default: a new <deployment>/logs/tritonserver-<time>.log per server)."),
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
                host=host,
                allow_api=[name.strip() for name in allow_api.split(",")] if allow_api else (),
                tritonserver=tritonserver,
                log_file=log_file,
                log_verbose=log_verbose,
                timeout=timeout,
                background=background,
            )
        if background:
            stop_hint = f"stop it with `trtdeploy stop --port {info.grpc_port}`"
            _announce(server, info, json=json, footer=f"Running in the background (pid {info.pid}); {stop_hint}.")
            return
        footer = "Serving; press Ctrl-C to stop."
        err.print(wait_foreground(server, lambda: _announce(server, info, json=json, footer=footer)) + ".")


def _announce(server: RunningServer, info: ServerInfo, *, json: bool, footer: str) -> None:
    """The startup notes and ``footer`` on stderr, the endpoints (or the record, with ``json``) on stdout."""
    for note in startup_notes(server):
        err.print(escape(note), soft_wrap=True)
    if json:
        emit_json(info.to_dict())
    else:
        _print_endpoints(info)
    err.print(escape(footer), soft_wrap=True)


def _print_endpoints(info: ServerInfo) -> None:
    """One aligned line per endpoint; soft-wrapped so long paths stay whole and copyable."""
    rows = {
        "HTTP": info.http_url,
        "gRPC": info.grpc_url,
        "metrics": info.metrics_url,
        "listening on": info.bind_address,
        "restricted": ", ".join(info.restricted_apis) or "nothing",
        "entry model": info.entry_model,
        "models": ", ".join(info.models),
        "deployment": info.deployment,
        "log": info.log_file,
        "pid": info.pid,
    }
    out.print("[green]✓[/] tritonserver is ready")
    for label, value in rows.items():
        out.print(f"  [bold]{label:<12}[/] {escape(str(value))}", soft_wrap=True)
