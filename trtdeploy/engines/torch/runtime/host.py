"""Copies between host and device that never hold the host."""

from __future__ import annotations

import torch


def to_device(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` (a list, an array or a CPU tensor) on ``device``. On a GPU the copy goes through pinned memory
    and is only queued: a copy from pageable memory may first wait for all the work queued on the stream, which
    would hold the decode loop while a step or an encoder runs."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def to_host(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A copy of ``tensor`` on the host and, from a GPU, the event after which it is there (queued, not waited for:
    the copy lands in pinned memory once the work queued before it has run)."""
    if tensor.device.type != "cuda":
        return tensor.clone(), None
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready
