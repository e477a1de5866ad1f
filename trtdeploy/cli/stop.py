"""``trtdeploy stop``: stop servers that ``trtdeploy serve`` started."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..server import servers_to_stop, stop_server
from ._options import JsonOpt
from ._output import emit_json, err, out


def stop(
    deployment: Annotated[
        Path | None,
        typer.Argument(
            help="Stop the server of this deployment folder (default: the one of the deployment under the current "
            "folder).",
            show_default=False,
        ),
    ] = None,
    *,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Stop the server using this port (HTTP, gRPC or metrics).")
    ] = None,
    all: Annotated[bool, typer.Option("--all", help="Stop every running server.")] = False,
    json: JsonOpt = False,
) -> None:
    """Stop a server started by `trtdeploy serve`, all of its processes; with nothing to stop, say so and exit 0."""
    servers, nothing = servers_to_stop(deployment=deployment, port=port, all=all)
    if nothing:
        err.print(escape(nothing), soft_wrap=True)
    with err.status("stopping tritonserver ..."):
        for info in servers:
            stop_server(info)
    if json:
        emit_json({"stopped": [info.to_dict() for info in servers]})
        return
    for info in servers:
        what = f"pid {info.pid} (gRPC {info.grpc_url}, deployment {info.deployment})"
        out.print(f"[green]✓[/] stopped tritonserver {escape(what)}", soft_wrap=True)
