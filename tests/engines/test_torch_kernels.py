"""The runtime's Triton kernels against the same arithmetic in PyTorch ops (their CPU path).

On a GPU the kernels run compiled. Without one, :func:`test_the_kernels_under_tritons_interpreter` runs this file
again under Triton's interpreter (``TRITON_INTERPRET=1``), which runs them on CPU tensors.
"""

import contextlib

import pytest
import torch

from trtdeploy.engines.torch.runtime import kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RUNS_KERNELS = kernels.triton is not None and (DEVICE == "cuda" or kernels.INTERPRETED)
kernel_test = pytest.mark.skipif(
    not RUNS_KERNELS,
    reason="compiled on a GPU; without one, run under Triton's interpreter by the test that runs this file again",
)

HEADS, DIM = 20, 64


@contextlib.contextmanager
def pytorch_path():
    """The kernel functions' PyTorch path whatever the device: the reference the kernels are checked against."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "fused", lambda *tensors, dim=1: False)
        yield


def on_cpu(value):
    if isinstance(value, tuple):
        return tuple(on_cpu(item) for item in value)
    if isinstance(value, torch.Tensor):  # a copy, even of a float32 CPU tensor: references must not alias inputs
        return (value.float() if value.is_floating_point() else value).cpu().clone()
    return value


@pytest.mark.skipif(
    kernels.triton is None or DEVICE == "cuda" or kernels.INTERPRETED, reason="runs the kernels where they compile"
)
def test_the_kernels_under_tritons_interpreter(trtdeploy_triton_interpreter):
    trtdeploy_triton_interpreter(__file__, "-k", "not interpreter")


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 1280), (2, 7, 1280), (5, 384)])
def test_add_layer_norm_matches_the_unfused_ops(dtype, shape):
    generator = torch.Generator().manual_seed(0)
    x, y = ((torch.randn(shape, generator=generator) * 4).to(DEVICE, dtype) for _ in range(2))
    norm = ((torch.rand(shape[-1]) + 0.5).to(DEVICE, dtype), torch.randn(shape[-1]).to(DEVICE, dtype))
    total, out = kernels.add_layer_norm(x, y, norm, 1e-5)
    with pytorch_path():
        ref_total, ref_out = kernels.add_layer_norm(on_cpu(x), on_cpu(y), on_cpu(norm), 1e-5)
    assert torch.equal(total.cpu().float(), ref_total.to(dtype).float())  # the sum rounds as the unfused add does
    tolerance = 1e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(out.cpu().float(), ref_out, atol=tolerance, rtol=tolerance)


@kernel_test
def test_add_layer_norm_clamps_before_normalising_and_broadcasts_the_addend():
    x = torch.tensor([[60000.0, -60000.0, 1.0, 2.0]], dtype=torch.float16).to(DEVICE)
    norm = (torch.ones(4, dtype=torch.float16).to(DEVICE), torch.zeros(4, dtype=torch.float16).to(DEVICE))
    total, out = kernels.add_layer_norm(x, x, norm, 1e-5, clamp=64504.0)
    with pytorch_path():
        ref_total, ref_out = kernels.add_layer_norm(on_cpu(x), on_cpu(x), on_cpu(norm), 1e-5, clamp=64504.0)
    assert torch.isfinite(total.cpu()).all()
    assert torch.equal(total.cpu().float(), ref_total.to(torch.float16).float())
    torch.testing.assert_close(out.cpu().float(), ref_out, atol=1e-2, rtol=1e-2)
    rows = torch.randn(3, 4).to(DEVICE, torch.float16)
    total, _ = kernels.add_layer_norm(rows, x[0], norm, 1e-5)  # one addend row for every row, as positions are
    assert torch.equal(total.cpu(), (rows + x[0]).cpu())


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_decode_self_attention_writes_the_new_key_and_attends_up_to_each_position(dtype):
    slots, max_len = 6, 448
    generator = torch.Generator().manual_seed(1)
    k_cache, v_cache = (torch.randn(slots + 1, HEADS, max_len, DIM, generator=generator).to(DEVICE, dtype)
                        for _ in range(2))  # fmt: skip
    qkv = (torch.randn(4, 3 * HEADS * DIM, generator=generator) * 0.5).to(DEVICE, dtype)
    positions = torch.tensor([0, 31, 32, 447], device=DEVICE)  # block edges, and the last position
    ref_k, ref_v = on_cpu(k_cache), on_cpu(v_cache)
    with pytorch_path():
        ref_out = kernels.decode_self_attention(on_cpu(qkv), ref_k, ref_v, positions.cpu(), span=448)
    out = kernels.decode_self_attention(qkv, k_cache, v_cache, positions, span=448)
    tolerance = 2e-3 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(out.cpu().float(), ref_out, atol=tolerance, rtol=tolerance)
    assert torch.equal(k_cache.cpu().float(), ref_k) and torch.equal(v_cache.cpu().float(), ref_v)


@kernel_test
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(14, 2, 64), (8, 8, 128)], ids=["gqa", "mha"])
def test_rope_write_kv_rotates_queries_and_keys_and_writes_each_rows_position(dtype, heads, kv_heads, dim):
    slots, max_len = 6, 448
    generator = torch.Generator().manual_seed(4)
    k_cache, v_cache = (torch.randn(slots + 1, kv_heads, max_len, dim, generator=generator).to(DEVICE, dtype)
                        for _ in range(2))  # fmt: skip
    qkv = torch.randn(4, heads + 2 * kv_heads, dim, generator=generator).to(DEVICE, dtype)
    positions = torch.tensor([0, 31, 5, 447], device=DEVICE)
    # the tables as the decoder model makes them: cos, and sin with its first half negated
    angles = torch.arange(max_len)[:, None] * (10000.0 ** (-torch.arange(dim // 2) / (dim // 2)))[None, :]
    angles = torch.cat((angles, angles), -1)
    sin = torch.cat((-angles.sin()[:, : dim // 2], angles.sin()[:, dim // 2 :]), -1)
    rope = (angles.cos().to(DEVICE, dtype), sin.to(DEVICE, dtype))
    before = on_cpu(k_cache)
    ref_k, ref_v = on_cpu(k_cache), on_cpu(v_cache)
    with pytorch_path():
        ref_q = kernels.rope_write_kv(on_cpu(qkv), ref_k, ref_v, positions.cpu(), on_cpu(rope))
    q = kernels.rope_write_kv(qkv, k_cache, v_cache, positions, rope)
    # the kernel rounds a rotation once; the PyTorch path after each of its three ops
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(q.cpu().float(), ref_q, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(k_cache.cpu().float(), ref_k, atol=tolerance, rtol=tolerance)
    assert torch.equal(v_cache.cpu().float(), ref_v)
    written = (before != ref_k).any(-1).nonzero()[:, [0, 2]].unique(dim=0).tolist()  # (slot, position) pairs
    assert written == [[0, 0], [1, 31], [2, 5], [3, 447]]


@kernel_test
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_add_rms_norm_and_silu_mul_match_the_unfused_ops(dtype):
    generator = torch.Generator().manual_seed(3)
    x, y = ((torch.randn(3, 896, generator=generator) * 4).to(DEVICE, dtype) for _ in range(2))
    weight = (torch.rand(896, generator=generator) + 0.5).to(DEVICE, dtype)
    gate_up = torch.randn(5, 2 * 4864, generator=generator).to(DEVICE, dtype)
    total, out = kernels.add_rms_norm(x, y, weight, 1e-6)
    gated = kernels.silu_mul(gate_up)
    with pytorch_path():
        ref_total, ref_out = kernels.add_rms_norm(on_cpu(x), on_cpu(y), on_cpu(weight), 1e-6)
        ref_gated = kernels.silu_mul(on_cpu(gate_up))
    assert torch.equal(total.cpu().float(), ref_total.to(dtype).float())
    tolerance = 1e-2 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out.cpu().float(), ref_out, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(gated.cpu().float(), ref_gated, atol=tolerance, rtol=tolerance)


@kernel_test
@pytest.mark.parametrize("frames", [1500, 37])
def test_write_cross_kv_fills_each_inputs_slot_at_its_frames(frames):
    slots, max_frames = 5, 1500
    k_cache, v_cache = (torch.zeros(slots + 1, HEADS, max_frames, DIM, dtype=torch.float16).to(DEVICE)
                        for _ in range(2))  # fmt: skip
    kv = torch.randn(3, frames, 2 * HEADS * DIM).to(DEVICE, torch.float16)
    slot_index = torch.tensor([4, 0, 2], device=DEVICE)
    ref_k, ref_v = k_cache.cpu(), v_cache.cpu()
    with pytorch_path():
        kernels.write_cross_kv(kv.cpu(), ref_k, ref_v, slot_index.cpu())
    kernels.write_cross_kv(kv, k_cache, v_cache, slot_index)
    assert torch.equal(k_cache.cpu(), ref_k) and torch.equal(v_cache.cpu(), ref_v)
    assert ref_k[4].abs().sum() > 0 and ref_k[1].abs().sum() == 0


@kernel_test
def test_gumbel_noise_is_the_hash_of_the_pytorch_ops_for_ranked_and_expanded_ids():
    seeds = torch.tensor([5, 2**62 + 12345, 0], device=DEVICE)
    counters = torch.tensor([0, 7, 2**31 + 3], device=DEVICE)
    ranked = torch.randint(0, 158336, (3, 64), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    expanded = torch.arange(1024, 1024 + 3000, device=DEVICE).expand(3, -1)  # a window of the vocabulary, each row
    for ids in (ranked, expanded):
        noise = kernels.gumbel_noise(seeds, counters, ids)
        with pytorch_path():
            expected = kernels.gumbel_noise(seeds.cpu(), counters.cpu(), ids.cpu())
        assert noise.shape == ids.shape and noise.dtype == torch.float32
        torch.testing.assert_close(noise.cpu(), expected, atol=1e-5, rtol=1e-5)
