"""Where output goes: results on stdout (JSON only, with ``--json``), everything for humans on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

#: Progress, logs, warnings and errors.
err = Console(stderr=True, highlight=False, soft_wrap=True)
#: Human-readable results (tables). Never used in ``--json`` mode.
out = Console(highlight=False, soft_wrap=True)


def emit_json(data: Any) -> None:
    """Write one JSON document to stdout (the only thing on stdout in ``--json`` mode)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    """One ``Warning:`` line on stderr, for problems that do not stop the command."""
    err.print(f"[yellow]Warning:[/] {escape(message)}")
