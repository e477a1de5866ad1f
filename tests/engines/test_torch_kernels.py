"""The runtime's Triton kernels against the same arithmetic in PyTorch ops (their CPU path), on a GPU."""

import pytest
import torch

from trtdeploy.engines.torch.runtime import kernels

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or kernels.triton is None, reason="the Triton kernels need a GPU and Triton"
)

HEADS, DIM = 20, 64


def on_cpu(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [tensor.cpu().float() for tensor in tensors]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 1280), (2, 7, 1280), (5, 384)])
def test_add_layer_norm_matches_the_unfused_ops(dtype, shape):
    generator = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.randn(shape, device="cuda", generator=generator).to(dtype) * 4 for _ in range(2))
    norm = (torch.rand(shape[-1], device="cuda").to(dtype) + 0.5, torch.randn(shape[-1], device="cuda").to(dtype))
    total, out = kernels.add_layer_norm(x, y, norm, 1e-5)
    ref_total, ref_out = kernels.add_layer_norm(*on_cpu(x, y), tuple(on_cpu(*norm)), 1e-5)
    assert torch.equal(total.cpu().float(), ref_total.to(dtype).float())  # the sum rounds as the unfused add does
    tolerance = 1e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(out.cpu().float(), ref_out, atol=tolerance, rtol=tolerance)


def test_add_layer_norm_clamps_before_normalising():
    x = torch.tensor([[60000.0, -60000.0, 1.0, 2.0]], device="cuda", dtype=torch.float16)
    norm = (torch.ones(4, device="cuda", dtype=torch.float16), torch.zeros(4, device="cuda", dtype=torch.float16))
    total, out = kernels.add_layer_norm(x, x, norm, 1e-5, clamp=64504.0)
    ref_total, ref_out = kernels.add_layer_norm(*on_cpu(x, x), tuple(on_cpu(*norm)), 1e-5, clamp=64504.0)
    assert torch.isfinite(total).all()
    assert torch.equal(total.cpu().float(), ref_total.to(torch.float16).float())
    torch.testing.assert_close(out.cpu().float(), ref_out, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_decode_self_attention_writes_the_new_key_and_attends_up_to_each_position(dtype):
    slots, max_len = 6, 448
    generator = torch.Generator(device="cuda").manual_seed(1)
    k_cache, v_cache = (torch.randn(slots + 1, HEADS, max_len, DIM, device="cuda", generator=generator).to(dtype)
                        for _ in range(2))  # fmt: skip
    qkv = (torch.randn(4, 3 * HEADS * DIM, device="cuda", generator=generator) * 0.5).to(dtype)
    positions = torch.tensor([0, 31, 32, 447], device="cuda")  # block edges, and the last position
    ref_k, ref_v = on_cpu(k_cache, v_cache)
    ref_out = kernels.decode_self_attention(*on_cpu(qkv), ref_k, ref_v, positions.cpu(), span=448)
    out = kernels.decode_self_attention(qkv, k_cache, v_cache, positions, span=448)
    tolerance = 2e-3 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(out.cpu().float(), ref_out, atol=tolerance, rtol=tolerance)
    assert torch.equal(k_cache.cpu().float(), ref_k) and torch.equal(v_cache.cpu().float(), ref_v)


@pytest.mark.parametrize("frames", [1500, 37])
def test_write_cross_kv_fills_each_inputs_slot_at_its_frames(frames):
    slots, max_frames = 5, 1500
    k_cache, v_cache = (torch.zeros(slots + 1, HEADS, max_frames, DIM, device="cuda", dtype=torch.float16)
                        for _ in range(2))  # fmt: skip
    kv = torch.randn(3, frames, 2 * HEADS * DIM, device="cuda").to(torch.float16)
    slot_index = torch.tensor([4, 0, 2], device="cuda")
    ref_k, ref_v = k_cache.cpu(), v_cache.cpu()
    kernels.write_cross_kv(kv.cpu(), ref_k, ref_v, slot_index.cpu())
    kernels.write_cross_kv(kv, k_cache, v_cache, slot_index)
    assert torch.equal(k_cache.cpu(), ref_k) and torch.equal(v_cache.cpu(), ref_v)
    assert ref_k[4].abs().sum() > 0 and ref_k[1].abs().sum() == 0
