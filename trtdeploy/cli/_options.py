"""Option and argument types shared by several commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import UsageError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (nothing else there).")]
DeploymentArg = Annotated[
    Path | None,
    typer.Argument(
        help="Deployment folder written by `trtdeploy build` (default: the latest one under the current folder).",
        show_default=False,
    ),
]
ModelArg = Annotated[str, typer.Argument(help="Model name, as listed by `trtdeploy plugins`.", show_default=False)]


def parse_int_list(text: str, *, name: str, minimum: int = 1) -> list[int]:
    """Parse ``1,2,4`` into ``[1, 2, 4]``; raise UsageError naming the option and the bad item."""
    example = f"e.g. {name} {','.join(str(minimum * 2**i) for i in range(3))}"
    values: list[int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = int(item)
        except ValueError:
            raise UsageError(
                f"{name}: {item!r} in {text!r} is not an integer", hint=f"pass comma-separated integers, {example}"
            ) from None
        if value < minimum:
            raise UsageError(f"{name} values must be >= {minimum}, got {value}", hint=example)
        values.append(value)
    if not values:
        raise UsageError(f"{name} needs at least one value", hint=example)
    return values


def parse_key_values(items: list[str], *, name: str) -> dict[str, str]:
    """Parse repeated ``key=value`` items into a dict; raise UsageError naming the option and the bad item."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{name} expects key=value, got {item!r}", hint=f"e.g. {name} key=value")
        result[key.strip()] = value.strip()
    return result
