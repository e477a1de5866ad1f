"""``trtdeploy plugins``: what is installed."""

from __future__ import annotations

from dataclasses import asdict

from rich.table import Table

from ..plugins import failed_plugins, list_plugins
from ._options import JsonOpt
from ._output import emit_json, out


def plugins(*, json: JsonOpt = False) -> None:
    """List installed plugins: name, version, the models and engines they register, and the hooks they implement."""
    infos = list_plugins()
    failed = failed_plugins()
    if json:
        emit_json({"plugins": [asdict(info) for info in infos], "failed": failed})
        return
    table = Table("plugin", "version", "models", "engines", "hooks")
    for info in infos:
        table.add_row(
            info.name, info.version or "-", ", ".join(info.models), ", ".join(info.engines), ", ".join(info.hooks)
        )
    for name, error in failed.items():
        table.add_row(f"[red]{name}[/]", "-", "", "", f"[red]failed to load: {error}[/]")
    out.print(table)
