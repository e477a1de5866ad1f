"""TensorRT-LLM versions the trtllm engine plans for, and what changes between them.

The engine flow (``convert_checkpoint.py`` / ``quantize.py`` + ``trtllm-build`` + the C++ ``tensorrtllm`` Triton
backend) exists from the releases we support, 0.17.x, up to the 1.2.x line; upstream deletes it after that.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ...errors import UsageError
from ...spec import BuildContext
from ..base import Engine
from . import releases
from .releases import Release

OLDEST = releases.RELEASES[0].line
NEWEST = releases.RELEASES[-1].line
#: What a dry run plans for when no TensorRT-LLM is installed and no --trtllm-version is given.
LATEST_KNOWN = "1.2.1"

#: TensorRT-LLM version -> the NGC Triton release whose ``<tag>-trtllm-python-py3`` image ships it.
TRITON_IMAGES = {
    "0.17.0": "25.01",
    "0.17.0.post1": "25.02",
    "0.18.0": "25.03",
    "0.18.2": "25.04",
    "0.19.0": "25.05",
    "0.20.0": "25.07",
    "0.21.0": "25.08",
    "1.0.0": "25.10",
    "1.1.0": "26.02",
    "1.2.0": "26.03",
    "1.2.1": "26.07",
}
IMAGE = "nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3"


@dataclass(frozen=True)
class TrtllmVersion:
    """A TensorRT-LLM release, e.g. ``0.17.0.post1`` or ``1.2.1``."""

    text: str
    major: int
    minor: int

    @classmethod
    def parse(
        cls, text: str, *, oldest: tuple[int, int] = OLDEST, newest: tuple[int, int] | None = NEWEST
    ) -> TrtllmVersion:
        """Parse a release number, refusing one outside [oldest, newest] (whole lines; ``newest`` None: open)."""
        match = re.fullmatch(r"v?(\d+)\.(\d+)(\.\d+)?([.\w+-]*)", text.strip())
        if not match:
            raise UsageError(f"--trtllm-version {text!r} is not a version", hint="e.g. 0.17.0.post1, 0.19.0, 1.2.1")
        found = cls(text.strip().removeprefix("v"), int(match[1]), int(match[2]))
        if found.line < oldest or (newest is not None and found.line > newest):
            span = (
                f"{'.'.join(map(str, oldest))}.x to {'.'.join(map(str, newest))}.x"
                if newest
                else (f"{'.'.join(map(str, oldest))} or newer")
            )
            hint = (
                "newer releases have no engine build step: use --engine trtllm_pytorch"
                if newest and found.line > newest
                else "older releases have no PyTorch backend: use --engine trtllm"
                if not newest
                else None
            )
            raise UsageError(f"TensorRT-LLM {found.text} is outside what this engine plans for ({span})", hint=hint)
        return found

    @property
    def line(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def facts(self) -> Release:
        """This release line's facts (see :mod:`.releases`)."""
        return releases.of(self.line)

    @property
    def triton_image(self) -> tuple[str, bool]:
        """The NGC serving image for this release, and whether it ships exactly this version."""
        if self.text in TRITON_IMAGES:
            return IMAGE.format(tag=TRITON_IMAGES[self.text]), True
        same_line = [v for v in TRITON_IMAGES if TrtllmVersion.parse(v, newest=None).line == self.line]
        if not same_line:  # a release newer than the table: the newest image we know, to be checked by hand
            return IMAGE.format(tag=TRITON_IMAGES[LATEST_KNOWN]), False
        return IMAGE.format(tag=TRITON_IMAGES[same_line[-1]]), False


def installed() -> str | None:
    """The installed tensorrt_llm's version, without importing it (that takes seconds and a GPU)."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        return version("tensorrt_llm")
    except PackageNotFoundError:
        try:
            return version("tensorrt-llm")
        except PackageNotFoundError:
            return None


class TensorRTLLMEngine(Engine):
    """What the engines on TensorRT-LLM share: the release they plan for (installed, or ``--trtllm-version``)."""

    #: The release lines this engine supports (``newest`` None: no upper bound).
    oldest: tuple[int, int] = OLDEST
    newest: tuple[int, int] | None = NEWEST

    def default_precision(self, device: str) -> str:
        return "bf16"

    def versions(self) -> dict[str, str]:
        found = installed()
        return {"tensorrt_llm": found} if found else {}

    def resolve_version(self, requested: str | None, *, dry_run: bool) -> str | None:
        """``--trtllm-version`` (a real build only when it is the installed one), the installed release, or for a
        dry run without TensorRT-LLM here the newest release we know."""
        found = installed()
        target = self.release_of(requested or found or LATEST_KNOWN)
        if requested and found and not dry_run and TrtllmVersion.parse(found, newest=None) != target:
            raise UsageError(
                f"--trtllm-version {requested} differs from the installed TensorRT-LLM {found}",
                hint="engines run only under the release that built them: drop the flag, or use --dry-run",
            )
        return target.text

    def kv_cache_parameters(self, ctx: BuildContext) -> dict[str, Any]:
        """The KV-cache pool: the GPU profile's share of free memory, and never more than the point can use."""
        assert ctx.gpu_profile is not None  # validate() refuses CPU builds
        return {
            "kv_cache_free_gpu_mem_fraction": ctx.gpu_profile.defaults.kv_cache_free_gpu_mem_fraction,
            "max_tokens_in_paged_kv_cache": ctx.point.kv_cache_tokens,
        }

    def release_of(self, text: str) -> TrtllmVersion:
        return TrtllmVersion.parse(text, oldest=self.oldest, newest=self.newest)

    def release(self, ctx: BuildContext) -> TrtllmVersion:
        """The release a build point targets."""
        return self.release_of(ctx.point.engine_version or LATEST_KNOWN)
