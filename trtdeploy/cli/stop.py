"""``trtdeploy stop``: stop servers that ``trtdeploy serve`` started."""

from __future__ import annotations

from typing import Annotated

import typer

from ..server import stop_servers
from ._options import JsonOpt
from ._output import emit_json, err, out


def stop(
    *,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="Stop the server using this port (HTTP, gRPC or metrics).")
    ] = None,
    all: Annotated[bool, typer.Option("--all", help="Stop every running server.")] = False,
    json: JsonOpt = False,
) -> None:
    """Stop a server started by `trtdeploy serve` (the most recently started one by default), all of its processes."""
    with err.status("stopping tritonserver ..."):
        stopped = stop_servers(port=port, all=all)
    if json:
        emit_json({"stopped": [info.to_dict() for info in stopped]})
        return
    for info in stopped:
        out.print(f"[green]✓[/] stopped tritonserver pid {info.pid} (gRPC {info.grpc_url}, HTTP {info.http_url})")
