"""The engine interface: what turns a checkpoint into the ``tensorrt_llm`` Triton model of a deployment."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..spec import BuildContext


@dataclass(frozen=True)
class BuildStep:
    """One step of a build plan: an external command (``argv``) or an in-process function (``run``).

    The core runs the steps in order, logs each to ``logs/<name>.log`` and records it in the manifest. Steps run
    with the folder being built as their working directory (it is renamed into place only when every step has
    succeeded), so they name its files by relative paths: ``checkpoint/``, ``engines/``.
    """

    name: str
    description: str
    argv: tuple[str, ...] = ()
    run: Callable[[Path], None] | None = None  # called with the log file path
    env: dict[str, str] = field(default_factory=dict)


class Engine(ABC):
    """Serves the LLM contract (``input_ids`` … in, ``output_ids``/``sequence_length`` out) as a Triton model."""

    #: ``--engine`` value.
    name: ClassVar[str]
    description: ClassVar[str] = ""
    #: Precisions this engine can build.
    precisions: ClassVar[tuple[str, ...]]
    #: Folder holding the LLM model template: ``tensorrt_llm/config.pbtxt.j2`` and ``tensorrt_llm/1/*``.
    templates_dir: ClassVar[Path]
    #: Rank for ``--engine auto``: the usable engine with the highest rank serves the build.
    rank: ClassVar[int] = 0

    @abstractmethod
    def unavailable_reason(self) -> str | None:
        """None when this engine can build and serve on this machine, else a one-line reason."""

    @abstractmethod
    def default_precision(self, device: str) -> str:
        """The precision used when ``--precision`` is not given, for ``cpu`` or ``cuda``."""

    def validate(self, ctx: BuildContext) -> None:  # noqa: B027 (optional hook: most engines accept every point)
        """Reject a point this engine cannot build, before anything runs (raise UsageError)."""

    def steps(self, ctx: BuildContext) -> list[BuildStep]:
        """Convert/quantize/build steps; an engine that serves the checkpoint as it is returns none."""
        return []

    @abstractmethod
    def template_context(self, ctx: BuildContext) -> dict[str, Any]:
        """Variables for the LLM model template (under the name ``engine``)."""

    def versions(self) -> dict[str, str]:
        """Versions of the tools this engine depends on, recorded in the manifest (a change forces a rebuild)."""
        return {}
