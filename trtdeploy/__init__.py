"""trtdeploy: from a Hugging Face checkpoint to a benchmarked Triton deployment.

The public API for plugins is what this module exports (``__all__``; docs/writing-plugins.md lists and explains each
name): a plugin imports nothing else of trtdeploy. The perf workloads and the helpers of Triton python models load
on first use, so that importing trtdeploy stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .checkpoints import QWEN2_0_5B, TinyShape, TokenizerKind, write_random_causal_lm
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


#: What Triton python models use of :mod:`.backend_utils`.
_BACKEND_HELPERS = (
    "CallAhead",
    "ModelParameters",
    "RequestError",
    "Sampling",
    "bls_request",
    "call_model",
    "decode_text",
    "error_response",
    "first_sequence",
    "generate_segment",
    "has_input",
    "optional_scalar",
    "read_sampling",
    "reference_wav",
    "row_tensor",
    "segment_seed",
)
#: Names loaded on first use, and the module each comes from.
_LAZY = {
    "TrtllmRelease": ".engines.trtllm.releases:Release",  # the release facts' type, as the functions above load it
    **{
        name: f".perf.workload:{name}"
        for name in ("Chunk", "InputRow", "ModelInfo", "Request", "RequestOptions", "Result", "TensorSpec", "Workload")
    },
    "TextLLMWorkload": ".perf.llm:TextLLMWorkload",
    "TTSWorkload": ".perf.tts:TTSWorkload",
    "ASRWorkload": ".perf.asr_workload:ASRWorkload",
    # helpers of Triton python models (run inside Triton's python backend, which provides their pb_utils)
    **{name: f".backend_utils:{name}" for name in _BACKEND_HELPERS},
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = target.split(":")
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value
    return value


__all__ = [
    "BuildContext",
    "BuildError",
    "BuildPoint",
    "BuildStep",
    "Deployment",
    "Engine",
    "ExitCode",
    "Interrupted",
    "MODES",
    "Mode",
    "ModelSpec",
    "NetworkError",
    "NotFoundError",
    "PerfError",
    "QWEN2_0_5B",
    "ServerError",
    "TextLLMOptions",
    "TextLLMSpec",
    "TinyShape",
    "TokenizerKind",
    "TrtDeployError",
    "UsageError",
    "__version__",
    "hookimpl",
    "newest_trtllm_release",
    "trtllm_release",
    "write_random_causal_lm",
]
__all__ += sorted(_LAZY)  # the names loaded on first use
