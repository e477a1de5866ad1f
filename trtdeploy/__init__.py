"""trtdeploy: from a Hugging Face checkpoint to a benchmarked Triton deployment.

The public API for plugins is what this module exports (plus :mod:`trtdeploy.perf.workload` for perf workloads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .checkpoints import TinyShape, TokenizerKind, write_random_causal_lm
from .deployment import Deployment
from .engines.base import BuildStep, Engine
from .errors import (
    BuildError,
    ExitCode,
    Interrupted,
    NetworkError,
    NotFoundError,
    PerfError,
    ServerError,
    TrtDeployError,
    UsageError,
)
from .hookspecs import hookimpl
from .spec import MODES, BuildContext, BuildPoint, Mode, ModelSpec
from .text_llm import TextLLMOptions, TextLLMSpec

if TYPE_CHECKING:
    from .engines.trtllm.releases import Release as TrtllmRelease

__version__ = "0.1.0"


def trtllm_release(line: tuple[int, int]) -> TrtllmRelease:
    """The facts of TensorRT-LLM release line ``line`` (e.g. ``(0, 20)``) that its C++ backend's tensors and official
    ensemble depend on, each with its source; LookupError for a line the trtllm engine does not plan for."""
    from .engines.trtllm import releases  # on first use: the engine's package loads numpy

    return releases.of(line)


def newest_trtllm_release() -> TrtllmRelease:
    """The newest release line's facts: what engines not tied to a release (torch, trtllm_pytorch) follow."""
    from .engines.trtllm import releases

    return releases.newest()


def __getattr__(name: str) -> Any:
    if name == "TrtllmRelease":  # the row's type, loaded on first use as the functions above do
        from .engines.trtllm.releases import Release

        return Release
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MODES",
    "BuildContext",
    "BuildError",
    "BuildPoint",
    "BuildStep",
    "Deployment",
    "Engine",
    "ExitCode",
    "Interrupted",
    "Mode",
    "ModelSpec",
    "NetworkError",
    "NotFoundError",
    "PerfError",
    "ServerError",
    "TextLLMOptions",
    "TextLLMSpec",
    "TinyShape",
    "TokenizerKind",
    "TrtDeployError",
    "TrtllmRelease",
    "UsageError",
    "__version__",
    "hookimpl",
    "newest_trtllm_release",
    "trtllm_release",
    "write_random_causal_lm",
]
