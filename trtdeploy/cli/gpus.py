"""``trtdeploy gpus``: the GPU profiles ``--gpu`` accepts, and the GPUs nvidia-smi finds here."""

from __future__ import annotations

from rich.table import Table

from .. import gpus as profiles
from ._options import JsonOpt
from ._output import emit_json, out


def gpus(*, json: JsonOpt = False) -> None:
    """List GPU profiles: compute capability, memory, precisions, and the defaults a build uses on each."""
    local = profiles.detect()
    rows = list(profiles.PROFILES.values())
    if local is not None and local.profile not in rows:
        rows.append(local.profile)  # a GPU without a profile of its own: shown with its measurements
    here = local.profile.name if local else None
    if json:
        emit_json(
            {
                "detected": {"gpu": here, "count": local.count} if local else None,
                "profiles": [
                    {
                        "name": p.name,
                        "compute_capability": ".".join(map(str, p.compute_capability)),
                        "memory_gib": p.memory_gib,
                        "precisions": list(p.precisions),
                        "defaults": vars(p.defaults),
                        "detected": p.name == here,
                    }
                    for p in rows
                ],
            }
        )
        return
    common = [name for name in profiles.PRECISION_MIN_SM if all(p.supports(name) for p in rows)]
    table = Table("GPU", "SM", "memory", "bf16", "fp8", "max batch", "KV fraction", "max tokens")
    for p in rows:
        name = f"[green]{p.name} ({local.count}x here)[/]" if p.name == here and local else p.name
        d = p.defaults
        table.add_row(
            name,
            ".".join(map(str, p.compute_capability)),
            f"{p.memory_gib} GiB",
            "yes" if p.supports("bf16") else "no",
            "yes" if p.supports("fp8") else "no",
            str(d.max_batch_size),
            f"{d.kv_cache_free_gpu_mem_fraction:g}",
            str(d.max_num_tokens),
        )
    out.print(table)
    out.print(f"every profile runs {', '.join(common)}")
    out.print("--gpu NAME[:COUNT] picks one; --gpu auto reads nvidia-smi" + ("" if local else " (none found here)"))
