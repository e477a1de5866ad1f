"""``trtdeploy plugins``: what is installed."""

from __future__ import annotations

from dataclasses import asdict

from rich.table import Table

from ..plugins import failed_plugins, list_plugins
from ._options import JsonOpt
from ._output import emit_json, out, warn


def plugins(*, json: JsonOpt = False) -> None:
    """List installed plugins: name, version, the models and engines they register, and the hooks they implement.

    A plugin that registers nothing (no @trtdeploy.hookimpl, or hooks that never call register) gets a warning; one
    that failed to load is listed with its error."""
    infos = list_plugins()
    failed = failed_plugins()
    for info in infos:
        if info.warning:
            warn(info.warning)
    if json:
        emit_json({"plugins": [asdict(info) for info in infos], "failed": failed})
        return
    table = Table("plugin", "version", "models", "engines", "hooks")
    for info in infos:
        models = ", ".join(info.models) if not info.warning else "[yellow]registers nothing[/]"
        table.add_row(info.name, info.version or "-", models, ", ".join(info.engines), ", ".join(info.hooks))
    for name, error in failed.items():
        table.add_row(f"[red]{name}[/]", "-", "", "", f"[red]failed to load: {error}[/]")
    out.print(table)
