"""GPU profiles: what ``--gpu NAME[:COUNT]`` means, and ``auto`` detection through nvidia-smi."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class GpuProfile:
    name: str
    compute_capability: tuple[int, int]
    memory_gib: int
    #: Substrings of nvidia-smi's product name that identify this GPU.
    aliases: tuple[str, ...] = ()

    @property
    def supports_fp8(self) -> bool:
        return self.compute_capability >= (8, 9)

    @property
    def supports_bf16(self) -> bool:
        return self.compute_capability >= (8, 0)


PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile("L4", (8, 9), 24, ("L4",)),
        GpuProfile("L20", (8, 9), 48, ("L20",)),
        GpuProfile("L40S", (8, 9), 48, ("L40S",)),
        GpuProfile("A10", (8, 6), 24, ("A10",)),
        GpuProfile("A10G", (8, 6), 24, ("A10G",)),
        GpuProfile("A100-40GB", (8, 0), 40, ("A100-SXM4-40GB", "A100-PCIE-40GB")),
        GpuProfile("A100-80GB", (8, 0), 80, ("A100-SXM4-80GB", "A100 80GB", "A100-80GB")),
        GpuProfile("H100", (9, 0), 80, ("H100",)),
        GpuProfile("H200", (9, 0), 141, ("H200",)),
        GpuProfile("RTX4090", (8, 9), 24, ("RTX 4090",)),
        GpuProfile("RTX5090", (12, 0), 32, ("RTX 5090",)),
        GpuProfile("B200", (10, 0), 180, ("B200",)),
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
