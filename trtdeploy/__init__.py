"""trtdeploy: from a Hugging Face checkpoint to a benchmarked Triton deployment.

The public API for plugins is what this module exports (plus :mod:`trtdeploy.perf.workload` for perf workloads).
"""

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

__version__ = "0.1.0"

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
    "TrtDeployError",
    "UsageError",
    "__version__",
    "hookimpl",
]
