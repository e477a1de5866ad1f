"""Assembles the commands and maps every :class:`TrtDeployError` to a one-line message and an exit code."""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Annotated, NoReturn

import typer

from .. import __version__
from ..errors import ExitCode, TrtDeployError, TrtDeployWarning
from ._output import err, warn

#: (module, command name): each module under trtdeploy.cli defines a function of the same name as the module, or a
#: typer.Typer of that name, whose commands become sub-commands (``export k8s``).
COMMANDS = (
    ("plugins", "plugins"),
    ("gpus", "gpus"),
    ("download", "download"),
    ("build", "build"),
    ("serve", "serve"),
    ("stop", "stop"),
    ("perf", "perf"),
    ("report", "report"),
    ("sweep", "sweep"),
    ("capacity", "capacity"),
    ("quickstart", "quickstart"),
    ("new_plugin", "new-plugin"),
    ("export", "export"),
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trtdeploy {__version__}")
        raise typer.Exit()


def _root(
    *,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Build, serve and benchmark speech and language models on Triton + TensorRT-LLM."""


def create_app() -> typer.Typer:
    app = typer.Typer(
        name="trtdeploy",
        rich_markup_mode="rich",
        context_settings={"help_option_names": ["-h", "--help"]},
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    for module_name, command in COMMANDS:
        module = importlib.import_module(f"{__package__}.{module_name}")
        found = getattr(module, module_name)
        if isinstance(found, typer.Typer):
            app.add_typer(found, name=command)
        else:
            app.command(name=command)(found)
    from ..plugins import call_each

    call_each("register_commands", app=app)
    return app


def _show_warnings_as_lines() -> None:
    """A trtdeploy warning (a broken plugin, a dead server cleaned up) is one line on stderr whenever it shows up,
    not a Python warning with a source line."""
    original = warnings.showwarning

    def show(message, category, *args, **kwargs):  # type: ignore[no-untyped-def]
        if issubclass(category, TrtDeployWarning):
            warn(str(message))
        else:
            original(message, category, *args, **kwargs)

    warnings.showwarning = show
    warnings.simplefilter("always", TrtDeployWarning)


def report(exc: TrtDeployError) -> None:
    """Print an error as ``Error: message`` (or its own label) plus hint and details, on stderr."""
    err.print(f"[bold red]{exc.label}:[/] {exc.message}", soft_wrap=True)
    if exc.details:
        err.print(exc.details, markup=False, soft_wrap=True)
    if exc.hint:
        err.print(f"[dim]Hint:[/] {exc.hint}", soft_wrap=True)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point."""
    _show_warnings_as_lines()
    try:
        app = create_app()
        app(args=argv, prog_name="trtdeploy")
    except TrtDeployError as exc:
        if os.environ.get("TRTDEPLOY_DEBUG"):
            raise
        report(exc)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        err.print("Interrupted.")
        sys.exit(int(ExitCode.INTERRUPTED))
    sys.exit(0)
