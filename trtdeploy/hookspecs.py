"""Every hook a trtdeploy plugin can implement.

Plugins are found through the ``trtdeploy`` entry-point group and implement these with ``@trtdeploy.hookimpl``.
They register objects; the core decides when and how those objects are used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import typer

    from .engines.base import Engine
    from .spec import ModelSpec

hookspec = pluggy.HookspecMarker("trtdeploy")
hookimpl = pluggy.HookimplMarker("trtdeploy")


# --- models and engines --------------------------------------------------------------------------------------


@hookspec
def register_models(register: Callable[[ModelSpec], None]) -> None:
    """Register the deployable models this plugin provides.

    Call ``register(spec)`` once per :class:`trtdeploy.ModelSpec` instance. Model names must be unique across all
    plugins; a clash is reported as an error naming both plugins. ``register`` checks what it is given: anything
    but a ModelSpec, a member left unset or misspelt, an override the core cannot call as the base's, or one name
    registered twice skips this plugin with a warning naming it and the problem.

    :param register: Call it with each model spec.
    """


@hookspec
def register_engines(register: Callable[[Engine], None]) -> None:
    """Register engines that can serve the LLM contract (``--engine`` values).

    Call ``register(engine)`` once per :class:`trtdeploy.Engine` instance, checked as in :func:`register_models`.
    The built-in ``torch`` engine is registered through this same hook.

    :param register: Call it with each engine.
    """


# --- command line -----------------------------------------------------------------------------------------------


@hookspec
def register_commands(app: typer.Typer) -> None:
    """Add commands to the ``trtdeploy`` command line.

    Use ``@app.command()`` or ``app.add_typer(...)``; raise :class:`trtdeploy.TrtDeployError` subclasses for
    errors so that they get the same one-line message and exit code as built-in commands.

    :param app: The root ``typer.Typer`` application.
    """
