"""Fused kernels for the runtime on a GPU, written in Triton (which comes with PyTorch's CUDA wheels).

Each function takes the same tensors on every device: on a CUDA device with Triton installed it runs one Triton
kernel, elsewhere the same arithmetic as PyTorch ops (the CPU path, and the reference the tests compare with). Under
Triton's interpreter (``TRITON_INTERPRET=1``) the kernels run on CPU tensors too: that is how the tests check them
on a machine without a GPU.
What they save is launches: a decode step at small batch runs ~20 small kernels per layer unfused (Whisper's at
batch 16, a Qwen's at batch 1), each a few microseconds whatever its size, and the encoder's residual adds and
LayerNorms each read and write the whole activation.

- :func:`add_layer_norm`, :func:`add_rms_norm`: a residual add (clamped, for fp16 activations) and the LayerNorm or
  RMSNorm of the sum, one pass.
- :func:`gumbel_noise`: the sampler's noise, a hash of (seed, counter, token id) turned into Gumbel noise, one pass
  (about 30 elementwise kernels unfused, a tenth of a decode step at batch 1).
- :func:`decode_self_attention`: a decode step's self-attention over each slot's cache up to its own position, with
  the new key and value written into the cache by the same kernel (no separate scatters, no mask, no span).
- :func:`rope_write_kv`: a decoder LM's decode step's rotary embedding of the new queries and keys, and the new keys
  and values written into the cache, one pass (five kernels unfused).
- :func:`silu_mul`: the gated MLP's ``silu(gate) * up`` from the fused gate/up projection, one pass.
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

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so that products of 32-bit values never overflow int64.
_MULTIPLIERS = (0x7FEB352D, 0x31848BAB)


def fused(*tensors: torch.Tensor, dim: int = 1) -> bool:
    """Whether the Triton kernel runs: on CUDA tensors (any, interpreted), with a head size it can tile (a power of
    two)."""
    on_device = INTERPRETED or all(tensor.is_cuda for tensor in tensors)
    return triton is not None and on_device and dim & (dim - 1) == 0


if triton is not None:

    @triton.jit
    def _add_norm_kernel(
        x_ptr, y_ptr, total_ptr, out_ptr, weight_ptr, bias_ptr, cols, eps, bound,
        CLAMP: tl.constexpr, RMS: tl.constexpr, BLOCK: tl.constexpr,
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
        weight = tl.load(weight_ptr + offsets, mask=inside).to(tl.float32)
        if RMS:  # as F.rms_norm: in float32, rounded once
            rstd = 1.0 / tl.sqrt(tl.sum(value * value, 0) / cols + eps)
            normed = value * rstd * weight
        else:
            centered = tl.where(inside, value - tl.sum(value, 0) / cols, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, 0) / cols + eps)
            normed = centered * rstd * weight + tl.load(bias_ptr + offsets, mask=inside).to(tl.float32)
        tl.store(out_ptr + row + offsets, normed.to(x.dtype), mask=inside)

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
    def _rope_write_kv_kernel(
        qkv_ptr, k_cache_ptr, v_cache_ptr, positions_ptr, cos_ptr, sin_ptr, q_ptr,
        heads, kv_heads, cache_slot, cache_head, cache_position,
        DIM: tl.constexpr,
    ):  # fmt: skip
        # One program per row and head of qkv: a query head is rotated into q, a key head rotated into the cache, a
        # value head copied into it.
        slot = tl.program_id(0)
        head = tl.program_id(1)
        dims = tl.arange(0, DIM)
        row = qkv_ptr + (slot.to(tl.int64) * (heads + 2 * kv_heads) + head) * DIM
        x = tl.load(row + dims)
        position = tl.load(positions_ptr + slot)
        cache = slot.to(tl.int64) * cache_slot + position * cache_position + dims
        if head < heads + kv_heads:  # x * cos + rotate_half(x) * sin, rotate_half's signs in the sin table
            cos = tl.load(cos_ptr + position * DIM + dims).to(tl.float32)
            sin = tl.load(sin_ptr + position * DIM + dims).to(tl.float32)
            rolled = tl.load(row + (dims + DIM // 2) % DIM).to(tl.float32)
            rotated = (x.to(tl.float32) * cos + rolled * sin).to(x.dtype)
            if head < heads:
                tl.store(q_ptr + (slot.to(tl.int64) * heads + head) * DIM + dims, rotated)
            else:
                tl.store(k_cache_ptr + cache + (head - heads).to(tl.int64) * cache_head, rotated)
        else:
            tl.store(v_cache_ptr + cache + (head - heads - kv_heads).to(tl.int64) * cache_head, x)

    @triton.jit
    def _mix32(x):
        """:func:`_mix` (its multipliers and mask written out: a kernel reads no module globals)."""
        x = x ^ (x >> 16)
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x = x ^ (x >> 16)
        x = (x * 0x31848BAB) & 0xFFFFFFFF
        return x ^ (x >> 16)

    @triton.jit
    def _gumbel_kernel(seeds_ptr, counters_ptr, ids_ptr, out_ptr, cols, ids_row_stride, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = columns < cols
        seed = tl.load(seeds_ptr + row)
        key = _mix32((seed & 0xFFFFFFFF) ^ _mix32((seed >> 32) & 0xFFFFFFFF))
        key = _mix32(key ^ _mix32(tl.load(counters_ptr + row) & 0xFFFFFFFF))
        ids = tl.load(ids_ptr + row * ids_row_stride + columns, mask=inside, other=0)
        uniform = ((_mix32(key ^ _mix32(ids)) >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        tl.store(out_ptr + row * cols + columns, -tl.log(-tl.log(uniform)), mask=inside)

    @triton.jit
    def _silu_mul_kernel(gate_up_ptr, out_ptr, cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < cols
        gate = tl.load(gate_up_ptr + row * 2 * cols + offsets, mask=inside, other=0.0).to(tl.float32)
        up = tl.load(gate_up_ptr + row * 2 * cols + cols + offsets, mask=inside, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * cols + offsets, out.to(out_ptr.dtype.element_ty), mask=inside)

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


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) on int64 tensors holding values below 2**32."""
    for multiplier in _MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * multiplier) & _MASK32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Uniform floats in (0, 1), one per ``token_ids [rows, n]`` entry, a pure function of (seed, counter, id)."""
    seeds = seeds.to(torch.int64)
    key = _mix((seeds & _MASK32) ^ _mix((seeds >> 32) & _MASK32))
    key = _mix(key ^ _mix(counters.to(torch.int64) & _MASK32))
    bits = _mix(key[:, None] ^ _mix(token_ids.to(torch.int64)))
    # 23 bits: (n + 0.5) / 2**23 is exact in float32 and below 1 (with 24 the largest rounds to 1.0, whose Gumbel
    # noise is +inf: that token would win whatever its logit, even a banned one)
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def gumbel_noise(seeds: torch.Tensor, counters: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``-log(-log(u))`` of :func:`uniform_noise`'s draws, float32 ``[rows, n]``; ``token_ids`` may be one row
    expanded over the rows. Fused, the logarithms may differ from PyTorch's in the last bits."""
    if not fused(seeds, counters, token_ids) or token_ids.stride(-1) != 1:
        return -torch.log(-torch.log(uniform_noise(seeds, counters, token_ids)))
    rows, cols = token_ids.shape
    out = torch.empty(rows, cols, dtype=torch.float32, device=token_ids.device)
    block = min(1024, triton.next_power_of_2(cols))
    _gumbel_kernel[(rows, triton.cdiv(cols, block))](
        seeds.to(torch.int64).contiguous(), counters.to(torch.int64).contiguous(), token_ids.to(torch.int64), out,
        cols, token_ids.stride(0), BLOCK=block, num_warps=4,
    )  # fmt: skip
    return out


def add_layer_norm(
    x: torch.Tensor, y: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor], eps: float, clamp: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x + y`` (clamped to ``[-clamp, clamp]`` when given) and its LayerNorm over the last dimension."""
    if not fused(x, y):
        total = x + y
        if clamp is not None:
            total = total.clamp(-clamp, clamp)
        return total, F.layer_norm(total, total.shape[-1:], *norm, eps)
    return _add_norm(x, y, *norm, eps, clamp, rms=False)


def add_rms_norm(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x + y`` and its RMSNorm over the last dimension."""
    if not fused(x, y):
        total = x + y
        return total, F.rms_norm(total, total.shape[-1:], weight, eps)
    return _add_norm(x, y, weight, weight, eps, None, rms=True)  # the bias argument is not read


def _add_norm(x, y, weight, bias, eps: float, clamp: float | None, rms: bool) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = x.contiguous(), y.expand_as(x).contiguous()
    cols = x.shape[-1]
    total, out = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    _add_norm_kernel[(x.numel() // cols,)](
        x, y, total, out, weight, bias, cols, eps, clamp or 0.0,
        CLAMP=clamp is not None, RMS=rms, BLOCK=block, num_warps=max(1, min(8, block // 256)),
    )  # fmt: skip
    return total, out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up [rows, 2 * cols]`` (the gate's columns first), ``[rows, cols]``."""
    if not fused(gate_up):
        gate, up = gate_up.chunk(2, -1)
        return F.silu(gate) * up
    rows, cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, cols, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(cols, block))](gate_up.contiguous(), out, cols, BLOCK=block, num_warps=4)
    return out


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


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of ``x [..., dim]``: ``x * cos + rotate_half(x) * sin``, with rotate_half's signs in
    the ``sin`` table (its first half negated), so that rotate_half is a plain roll by half the dimension."""
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, -1), sin)


def rope_write_kv(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """A decode step's rotary embedding and cache writes for rows ``qkv [batch, heads + 2 * kv_heads, dim]``
    (queries, then keys, then values): row ``i``'s query and key are rotated at ``positions[i]`` by the ``rope =
    (cos, sin)`` tables ``[max_len, dim]`` (the sin's first half negated), its key and value written there in
    ``k_cache``/``v_cache [>= batch, kv_heads, max_len, dim]``. Returns the rotated queries ``[batch, heads, dim]``."""
    batch, rows, dim = qkv.shape
    kv_heads = k_cache.shape[1]
    heads = rows - 2 * kv_heads
    if not fused(qkv, k_cache, dim=dim):
        cos, sin = (table[positions][:, None, :] for table in rope)
        qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]
        qk = rotate(qk, cos, sin)
        index = positions.view(batch, 1, 1, 1).expand(batch, kv_heads, 1, dim)
        k_cache[:batch].scatter_(2, index, qk[:, heads:].unsqueeze(2))
        v_cache[:batch].scatter_(2, index, v.unsqueeze(2))
        return qk[:, :heads]
    q = torch.empty(batch, heads, dim, dtype=qkv.dtype, device=qkv.device)
    _rope_write_kv_kernel[(batch, rows)](
        qkv.contiguous(), k_cache, v_cache, positions, *rope, q, heads, kv_heads, *k_cache.stride()[:3],
        DIM=dim, num_warps=1,
    )  # fmt: skip
    return q


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
