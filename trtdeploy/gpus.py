"""GPU profiles: what ``--gpu NAME[:COUNT]`` means, and ``auto`` detection through nvidia-smi."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from .errors import UsageError

#: Every precision a build can ask for, and the compute capability each needs (TRT-LLM's support matrix: FP8,
#: and INT4 AWQ with FP8 activations, need Ada/Hopper SM89+; BF16 and the integer formats need Ampere SM80+).
PRECISION_MIN_SM: dict[str, tuple[int, int]] = {
    "fp32": (7, 0),
    "fp16": (7, 0),
    "bf16": (8, 0),
    "fp8": (8, 9),
    "int8_wo": (8, 0),
    "int4_wo": (8, 0),
    "int4_awq": (8, 0),
    "int8_sq": (8, 0),
    "nvfp4": (10, 0),  # Blackwell
}


#: Tokens per engine step where no GPU profile sets it (the CPU): TensorRT-LLM's own default.
DEFAULT_MAX_NUM_TOKENS = 8192


@dataclass(frozen=True)
class GpuDefaults:
    """Build and runtime settings that fit a GPU's memory, used where the user gives none."""

    max_batch_size: int
    #: Share of the memory left after the weights that TRT-LLM may take for its paged KV cache.
    kv_cache_free_gpu_mem_fraction: float
    #: Tokens one engine step may process (prefill chunks included): bounds the activation memory.
    max_num_tokens: int

    @classmethod
    def for_memory(cls, memory_gib: int) -> GpuDefaults:
        if memory_gib <= 24:
            return cls(16, 0.8, DEFAULT_MAX_NUM_TOKENS)
        if memory_gib <= 48:
            return cls(32, 0.85, DEFAULT_MAX_NUM_TOKENS)
        if memory_gib <= 96:
            return cls(64, 0.9, 16384)
        return cls(128, 0.9, 16384)


@dataclass(frozen=True)
class GpuProfile:
    name: str
    compute_capability: tuple[int, int]
    memory_gib: int
    #: Substrings of nvidia-smi's product name that identify this GPU.
    aliases: tuple[str, ...] = ()
    #: The ``nvidia.com/gpu.product`` node labels GPU Feature Discovery gives this GPU's models (the NVML name with
    #: spaces as ``-``), where Kubernetes pods select their nodes.
    node_labels: tuple[str, ...] = ()

    @property
    def supports_fp8(self) -> bool:
        return self.supports("fp8")

    @property
    def supports_bf16(self) -> bool:
        return self.supports("bf16")

    @property
    def sm(self) -> str:
        """``SM89``-style architecture name."""
        return f"SM{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def precisions(self) -> tuple[str, ...]:
        return tuple(name for name in PRECISION_MIN_SM if self.supports(name))

    @property
    def defaults(self) -> GpuDefaults:
        return GpuDefaults.for_memory(self.memory_gib)

    def supports(self, precision: str) -> bool:
        needed = PRECISION_MIN_SM.get(precision)
        return needed is not None and self.compute_capability >= needed

    def unsupported_reason(self, precision: str) -> str | None:
        """Why this GPU cannot run ``precision``, or None."""
        if self.supports(precision) or precision not in PRECISION_MIN_SM:
            return None
        major, minor = PRECISION_MIN_SM[precision]
        return f"{precision} needs compute capability {major}.{minor}+ and the {self.name} is {self.sm}"


PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile("L4", (8, 9), 24, ("L4",), ("NVIDIA-L4",)),
        GpuProfile("L20", (8, 9), 48, ("L20",), ("NVIDIA-L20",)),
        GpuProfile("L40S", (8, 9), 48, ("L40S",), ("NVIDIA-L40S",)),
        GpuProfile("A10", (8, 6), 24, ("A10",), ("NVIDIA-A10",)),
        GpuProfile("A10G", (8, 6), 24, ("A10G",), ("NVIDIA-A10G",)),
        GpuProfile(
            "A100-40GB",
            (8, 0),
            40,
            ("A100-SXM4-40GB", "A100-PCIE-40GB"),
            ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
        ),
        GpuProfile(
            "A100-80GB",
            (8, 0),
            80,
            ("A100-SXM4-80GB", "A100 80GB", "A100-80GB"),
            ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
        ),
        GpuProfile("H100", (9, 0), 80, ("H100",), ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe")),
        GpuProfile("H200", (9, 0), 141, ("H200",), ("NVIDIA-H200",)),
        GpuProfile("RTX4090", (8, 9), 24, ("RTX 4090",), ("NVIDIA-GeForce-RTX-4090",)),
        GpuProfile("RTX5090", (12, 0), 32, ("RTX 5090",), ("NVIDIA-GeForce-RTX-5090",)),
        GpuProfile("B200", (10, 0), 180, ("B200",), ("NVIDIA-B200",)),
    )
}
CPU = "cpu"


@dataclass(frozen=True)
class GpuSelection:
    """The profile a build targets (``None`` for CPU) and how many GPUs (``None`` when not known)."""

    profile: GpuProfile | None
    count: int | None

    @property
    def label(self) -> str:
        return self.profile.name if self.profile else CPU


def lookup(name: str) -> GpuProfile:
    key = name.strip().upper().replace(" ", "")
    for profile in PROFILES.values():
        if profile.name.upper() == key:
            return profile
    aliases = {"A100": "A100-80GB", "A100-80G": "A100-80GB", "A100-40G": "A100-40GB", "4090": "RTX4090"}
    if key in aliases:
        return PROFILES[aliases[key]]
    raise UsageError(f"unknown GPU {name!r}", hint=f"known GPUs: {', '.join(PROFILES)}, auto or cpu")


def profile_for(product: str, memory_mib: int, compute_capability: tuple[int, int]) -> GpuProfile:
    """The profile of a GPU as nvidia-smi names it; a GPU without one gets a profile of its own measurements."""
    for profile in PROFILES.values():
        # an alias counts only as a whole word: "L4" is not "L40S", "A10" not "A10G"
        if any(
            re.search(rf"(?<![A-Z0-9]){re.escape(alias.upper())}(?![A-Z0-9])", product.upper())
            for alias in profile.aliases
        ):
            return profile
    name = re.sub(r"[^A-Za-z0-9]+", "-", product.removeprefix("NVIDIA ")).strip("-")
    return GpuProfile(name, compute_capability, round(memory_mib / 1024))


def detect() -> GpuSelection | None:
    """The local GPUs as nvidia-smi reports them, or None when there is no NVIDIA GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = ["--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader,nounits"]
    try:
        rows = subprocess.run([smi, *query], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = [[field.strip() for field in row.split(",")] for row in rows.splitlines() if row.strip()]
    if not gpus:
        return None
    product, memory, capability = gpus[0][:3]
    try:
        major, minor = (int(part) for part in capability.split("."))
        profile = profile_for(product, int(float(memory)), (major, minor))
    except ValueError:
        raise UsageError(f"cannot read nvidia-smi's report {gpus[0]}", hint="pass --gpu NAME explicitly") from None
    return GpuSelection(profile, len(gpus))


def resolve(value: str | None) -> GpuSelection:
    """Parse ``--gpu``: a profile name with an optional ``:COUNT``, ``auto`` (the default) or ``cpu``."""
    if value is None or value.strip().lower() == "auto":
        return detect() or GpuSelection(None, None)
    if value.strip().lower() == CPU:
        return GpuSelection(None, None)
    name, _, count_text = value.partition(":")
    count = None
    if count_text:
        if not count_text.isdigit() or int(count_text) < 1:
            raise UsageError(f"--gpu {value!r}: the count after ':' must be a positive integer (e.g. H100:8)")
        count = int(count_text)
    return GpuSelection(lookup(name), count)
