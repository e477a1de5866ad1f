from __future__ import annotations

import json

import pytest

from trtdeploy.memory import ModelShape, estimate

from .engines.trtllm_helpers import QWEN2_72B, QWEN3_30B_A3B, QWEN25_05B, WHISPER_LARGE_V3


@pytest.mark.parametrize(("config", "billions"), [(QWEN2_72B, 72.7), (QWEN25_05B, 0.494)])
def test_parameter_counts_match_the_published_sizes(config, billions):
    assert ModelShape.from_config(config).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_a_72b_model_needs_several_gpus_in_16_bits_and_fits_eight_in_fp8():
    shape = ModelShape.from_config(QWEN2_72B)
    point = {"max_batch_size": 16, "max_seq_len": 3072, "max_num_tokens": 16384, "memory_gib": 80}
    assert not estimate(shape, precision="fp16", **point).fits
    eight = estimate(shape, precision="fp8", tp=4, pp=2, **point)
    assert eight.fits and 8 < eight.weights < 10  # the 16-bit embedding and LM head are split by TP only
    # the KV cache: 80 layers x 8 KV heads x 128 x K and V in fp8, split over 4 x 2 GPUs
    assert eight.kv_cache == pytest.approx(16 * 3072 * 2 * 40 * 2 * 128 / 2**30)


def test_a_mixture_of_experts_is_sized_by_its_expert_width():
    assert ModelShape.from_config(QWEN3_30B_A3B).params / 1e9 == pytest.approx(30.5, rel=0.01)


def test_an_8_bit_kv_cache_takes_half_the_memory_of_a_16_bit_one():
    shape = ModelShape.from_config(QWEN25_05B)
    point = {"max_batch_size": 64, "max_seq_len": 4096, "max_num_tokens": 8192, "memory_gib": 80}
    sixteen = estimate(shape, precision="bf16", **point)
    for dtype in ("int8", "fp8"):
        assert estimate(shape, precision="bf16", kv_cache_dtype=dtype, **point).kv_cache == sixteen.kv_cache / 2


def test_whisper_is_sized_with_its_encoder_and_a_cross_attention_cache_per_sequence():
    shape = ModelShape.from_config(WHISPER_LARGE_V3)
    assert shape.params / 1e9 == pytest.approx(1.55, rel=0.01)  # encoder and decoder
    point = {"max_batch_size": 64, "max_seq_len": 448, "max_num_tokens": 8192, "memory_gib": 24}  # an L4
    found = estimate(shape, precision="fp16", **point)
    # 32 decoder layers' K and V of 1280 in 16 bits, for its own 448 tokens and the 1500 encoder frames
    assert found.kv_cache == pytest.approx(64 * (448 + 1500) * 2 * 32 * 1280 * 2 / 2**30)
    assert not found.fits and estimate(shape, precision="fp16", **{**point, "max_batch_size": 16}).fits


def test_read_returns_none_without_a_config(tmp_path):
    assert ModelShape.read(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_05B))
    assert ModelShape.read(tmp_path).num_kv_heads == 2
