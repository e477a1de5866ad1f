"""Fused kernels for the runtime on a GPU, written in Triton (which comes with PyTorch's CUDA wheels).

Each function takes the same tensors on every device: on a CUDA device with Triton installed it runs one Triton
kernel, elsewhere the same arithmetic as PyTorch ops (the CPU path, and the reference the tests compare with). Under
Triton's interpreter (``TRITON_INTERPRET=1``) the kernels run on CPU tensors too: that is how the tests check them
on a machine without a GPU.
What they save is launches: a Whisper decode step at batch 16 runs ~20 small kernels per layer, each a few
microseconds whatever its size, and the encoder's residual adds and LayerNorms each read and write the whole
activation.

- :func:`add_layer_norm`: a residual add (clamped, for fp16 activations) and the LayerNorm of the sum, one pass.
- :func:`decode_self_attention`: a decode step's self-attention over each slot's cache up to its own position, with
  the new key and value written into the cache by the same kernel (no separate scatters, no mask, no span).
- :func:`write_cross_kv`: the cross-attention keys and values of encoder frames, from the projection's
  frames-major output into the head-major cache slots (an indexed copy from a transposed view reads far below the
  memory bandwidth).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only PyTorch builds do not depend on Triton
    triton = None


#: Triton's interpreter runs kernels with NumPy on the CPU (read where kernels are defined, at import).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def fused(*tensors: torch.Tensor, dim: int = 1) -> bool:
    """Whether the Triton kernel runs: on CUDA tensors (any, interpreted), with a head size it can tile (a power of
    two)."""
    on_device = INTERPRETED or all(tensor.is_cuda for tensor in tensors)
    return triton is not None and on_device and dim & (dim - 1) == 0


if triton is not None:

    @triton.jit
    def _add_layer_norm_kernel(
        x_ptr, y_ptr, total_ptr, out_ptr, weight_ptr, bias_ptr, cols, eps, bound,
        CLAMP: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64) * cols
        offsets = tl.arange(0, BLOCK)
        inside = offsets < cols
        x = tl.load(x_ptr + row + offsets, mask=inside, other=0.0)
        y = tl.load(y_ptr + row + offsets, mask=inside, other=0.0)
        # Rounded to the activations' dtype as the unfused add is, before the clamp and the statistics.
        total = (x.to(tl.float32) + y.to(tl.float32)).to(x.dtype).to(tl.float32)
        if CLAMP:
            total = tl.minimum(tl.maximum(total, -bound), bound)
        total = total.to(x.dtype)
        tl.store(total_ptr + row + offsets, total, mask=inside)
        value = total.to(tl.float32)
        mean = tl.sum(value, 0) / cols
        centered = tl.where(inside, value - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, 0) / cols + eps)
        weight = tl.load(weight_ptr + offsets, mask=inside).to(tl.float32)
        bias = tl.load(bias_ptr + offsets, mask=inside).to(tl.float32)
        tl.store(out_ptr + row + offsets, (centered * rstd * weight + bias).to(x.dtype), mask=inside)

    @triton.jit
    def _decode_self_attention_kernel(
        qkv_ptr, k_cache_ptr, v_cache_ptr, positions_ptr, out_ptr,
        heads, cache_slot, cache_head, cache_position,
        DIM: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        slot = tl.program_id(0)
        head = tl.program_id(1)
        dims = tl.arange(0, DIM)
        row = qkv_ptr + slot.to(tl.int64) * 3 * heads * DIM
        q = tl.load(row + head * DIM + dims).to(tl.float32)
        new_k = tl.load(row + (heads + head) * DIM + dims)
        new_v = tl.load(row + (2 * heads + head) * DIM + dims)
        position = tl.load(positions_ptr + slot)
        cache = slot.to(tl.int64) * cache_slot + head.to(tl.int64) * cache_head
        tl.store(k_cache_ptr + cache + position * cache_position + dims, new_k)
        tl.store(v_cache_ptr + cache + position * cache_position + dims, new_v)
        # The new key from registers; the earlier ones from the cache, a block at a time, with an online softmax.
        best = tl.sum(q * new_k.to(tl.float32), 0)
        weights = tl.zeros_like(best) + 1.0
        acc = new_v.to(tl.float32)
        starts = tl.arange(0, BLOCK)
        for start in range(0, position, BLOCK):
            keys = start + starts
            earlier = keys < position
            at = cache + keys[:, None] * cache_position + dims[None, :]
            k = tl.load(k_cache_ptr + at, mask=earlier[:, None], other=0.0).to(tl.float32)
            scores = tl.where(earlier, tl.sum(k * q[None, :], 1), float("-inf"))
            top = tl.maximum(best, tl.max(scores, 0))
            rescale = tl.exp(best - top)
            p = tl.exp(scores - top)
            v = tl.load(v_cache_ptr + at, mask=earlier[:, None], other=0.0).to(tl.float32)
            acc = acc * rescale + tl.sum(p[:, None] * v, 0)
            weights = weights * rescale + tl.sum(p, 0)
            best = top
        out = out_ptr + slot.to(tl.int64) * heads * DIM + head * DIM + dims
        tl.store(out, (acc / weights).to(new_v.dtype))

    @triton.jit
    def _write_cross_kv_kernel(
        kv_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, frames, heads, cache_slot, cache_head, cache_frame,
        DIM: tl.constexpr, HEADS: tl.constexpr,
    ):  # fmt: skip
        index = tl.program_id(0)
        item = index // frames
        frame = index % frames
        head = tl.arange(0, HEADS)
        dims = tl.arange(0, DIM)
        inside = (head < heads)[:, None]
        source = kv_ptr + index.to(tl.int64) * 2 * heads * DIM + head[:, None] * DIM + dims[None, :]
        slot = tl.load(slots_ptr + item)
        target = slot * cache_slot + head[:, None].to(tl.int64) * cache_head + frame * cache_frame + dims[None, :]
        tl.store(k_cache_ptr + target, tl.load(source, mask=inside), mask=inside)
        tl.store(v_cache_ptr + target, tl.load(source + heads * DIM, mask=inside), mask=inside)


def add_layer_norm(
    x: torch.Tensor, y: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor], eps: float, clamp: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x + y`` (clamped to ``[-clamp, clamp]`` when given) and its LayerNorm over the last dimension."""
    if not fused(x, y):
        total = x + y
        if clamp is not None:
            total = total.clamp(-clamp, clamp)
        return total, F.layer_norm(total, total.shape[-1:], *norm, eps)
    x, y = x.contiguous(), y.expand_as(x).contiguous()
    cols = x.shape[-1]
    total, out = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    _add_layer_norm_kernel[(x.numel() // cols,)](
        x, y, total, out, *norm, cols, eps, clamp or 0.0,
        CLAMP=clamp is not None, BLOCK=block, num_warps=max(1, min(8, block // 256)),
    )  # fmt: skip
    return total, out


def decode_self_attention(
    qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor, span: int
) -> torch.Tensor:
    """One decode step's self-attention for rows ``qkv [batch, 3 * heads * dim]`` (queries pre-scaled): row ``i``
    writes its key and value at ``positions[i]`` of ``k_cache``/``v_cache [>= batch, heads, max_len, dim]`` and
    attends to its cache up to that position, which is below ``span`` (the kernel needs no span: it reads each
    row's own keys only). Returns ``[batch, heads * dim]``."""
    batch = qkv.shape[0]
    heads, dim = k_cache.shape[1], k_cache.shape[3]
    if not fused(qkv, k_cache, dim=dim):
        q, k, v = qkv.view(batch, 3 * heads, dim).chunk(3, 1)
        index = positions.view(batch, 1, 1, 1).expand(batch, heads, 1, dim)
        k_cache[:batch].scatter_(2, index, k.unsqueeze(2))
        v_cache[:batch].scatter_(2, index, v.unsqueeze(2))
        keys = torch.arange(span, device=qkv.device)
        mask = (keys[None, :] <= positions[:, None])[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k_cache[:batch, :, :span], v_cache[:batch, :, :span], attn_mask=mask, scale=1.0
        )
        return out.reshape(batch, heads * dim)
    out = torch.empty(batch, heads * dim, dtype=qkv.dtype, device=qkv.device)
    _decode_self_attention_kernel[(batch, heads)](
        qkv.contiguous(), k_cache, v_cache, positions, out, heads, *k_cache.stride()[:3], DIM=dim, BLOCK=32, num_warps=2
    )
    return out


def write_cross_kv(kv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Store ``kv [n, frames, 2 * heads * dim]`` (keys then values per frame) of input ``i`` into slot ``slots[i]``
    of ``k_cache``/``v_cache [slots, heads, max_frames, dim]``, at frames ``[0, frames)``."""
    count, frames = kv.shape[:2]
    heads, dim = k_cache.shape[1], k_cache.shape[3]
    if not fused(kv, k_cache, dim=dim):
        k, v = kv.unflatten(-1, (2 * heads, dim)).transpose(1, 2).chunk(2, 1)
        k_cache[slots, :, :frames] = k
        v_cache[slots, :, :frames] = v
        return
    _write_cross_kv_kernel[(count * frames,)](
        kv.contiguous(), k_cache, v_cache, slots, frames, heads, *k_cache.stride()[:3],
        DIM=dim, HEADS=triton.next_power_of_2(heads), num_warps=4,
    )  # fmt: skip
