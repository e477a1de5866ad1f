"""CosyVoice2's U-Net flow estimator on tiny random weights: shapes, padding, chunked causality, checkpoint keys."""

from __future__ import annotations

import math

import pytest
import torch
from trtdeploy_cosyvoice.token2wav.unet import (
    UNetEstimator,
    UNetEstimatorConfig,
    attention_bias,
    sinusoidal_time_embedding,
)

from trtdeploy.errors import UsageError

MEL = 8
CHUNK = 4
TINY = UNetEstimatorConfig(
    in_channels=4 * MEL,
    out_channels=MEL,
    channels=(16,),
    attention_head_dim=4,
    n_blocks=2,
    num_mid_blocks=2,
    num_heads=2,
    static_chunk_size=CHUNK,
)


@pytest.fixture(scope="module")
def estimator() -> UNetEstimator:
    torch.manual_seed(0)
    return UNetEstimator(TINY).eval()


def random_inputs(lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    """Inputs of a right-padded batch; the padding holds large garbage, which the model must never see."""
    generator = torch.Generator().manual_seed(seed)
    frames = max(lengths)
    mask = (torch.arange(frames) < torch.tensor(lengths).unsqueeze(1)).unsqueeze(1).float()

    def mel() -> torch.Tensor:
        values = torch.randn(len(lengths), MEL, frames, generator=generator)
        return torch.where(mask.bool(), values, 1e3 * torch.randn(values.shape, generator=generator))

    return {
        "x": mel(),
        "mask": mask,
        "mu": mel(),
        "t": torch.rand(len(lengths), generator=generator),
        "spks": torch.randn(len(lengths), MEL, generator=generator),
        "cond": mel(),
    }


def row(inputs: dict[str, torch.Tensor], index: int, frames: int) -> dict[str, torch.Tensor]:
    return {
        name: value[index : index + 1, :, :frames] if value.dim() == 3 else value[index : index + 1]
        for name, value in inputs.items()
    }


@torch.no_grad()
def test_output_is_the_mel_shape_and_zero_past_each_rows_end(estimator):
    inputs = random_inputs([11, 6], seed=1)
    velocity = estimator(**inputs)
    assert velocity.shape == (2, MEL, 11) and velocity.dtype == torch.float32
    assert velocity.isfinite().all() and velocity[:, :, :6].abs().mean() > 0.1
    assert velocity[1, :, 6:].abs().max() == 0


@torch.no_grad()
def test_half_precision_with_a_float32_time(estimator):
    inputs = random_inputs([9], seed=2)
    half = UNetEstimator(TINY).eval().to(torch.bfloat16)
    half.load_state_dict(estimator.state_dict())
    cast = {name: value if name == "t" else value.to(torch.bfloat16) for name, value in inputs.items()}
    velocity = half(**cast)
    assert velocity.dtype == torch.bfloat16
    torch.testing.assert_close(velocity.float(), estimator(**inputs), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("streaming", [False, True])
@torch.no_grad()
def test_each_row_of_a_padded_batch_equals_that_row_alone(estimator, streaming):
    lengths = [13, 7, 1, 10]
    inputs = random_inputs(lengths, seed=3)
    together = estimator(**inputs, streaming=streaming)
    for index, length in enumerate(lengths):
        alone = estimator(**row(inputs, index, length), streaming=streaming)
        torch.testing.assert_close(together[index : index + 1, :, :length], alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_streaming_frames_do_not_change_when_later_chunks_are_appended(estimator):
    inputs = random_inputs([3 * CHUNK + 2], seed=4)
    full = estimator(**inputs, streaming=True)
    for complete_chunks in (1, 2):
        cut = complete_chunks * CHUNK
        prefix = estimator(**row(inputs, 0, cut), streaming=True)
        torch.testing.assert_close(prefix, full[:, :, :cut], atol=1e-5, rtol=1e-5)
    # A cut inside a chunk hides later frames of that chunk, which the full run let its frames see.
    inside = estimator(**row(inputs, 0, CHUNK + 2), streaming=True)
    torch.testing.assert_close(inside[:, :, :CHUNK], full[:, :, :CHUNK], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(inside[:, :, CHUNK:], full[:, :, CHUNK : CHUNK + 2], atol=1e-3)
    # Without streaming every frame attends to the whole sequence.
    whole = estimator(**inputs)
    assert not torch.allclose(estimator(**row(inputs, 0, CHUNK)), whole[:, :, :CHUNK], atol=1e-3)


def test_attention_bias_hides_padding_and_later_chunks():
    mask = torch.tensor([[[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]]])
    full = attention_bias(mask, None, torch.float32)
    chunked = attention_bias(mask, 2, torch.float32)
    assert full.shape == chunked.shape == (1, 1, 6, 6)
    assert ((full[0, 0] == 0) == torch.tensor([[True] * 5 + [False]] * 6)).all()
    visible_keys = [2, 2, 4, 4, 5, 5]  # chunks [0, 1], [2, 3], [4, 5]; key 5 is padding
    expected = torch.arange(6).unsqueeze(0) < torch.tensor(visible_keys).unsqueeze(1)
    assert ((chunked[0, 0] == 0) == expected).all()
    assert chunked.min() == -1e10
    assert attention_bias(mask, 2, torch.float16).min() == -math.inf  # -1e10 saturates in float16, as upstream's


def test_time_embedding_is_sin_then_cos_of_1000_t():
    t = torch.tensor([0.0, 0.25])
    embedding = sinusoidal_time_embedding(t, 8, torch.float32)
    frequencies = torch.tensor([1.0, 10000 ** (-1 / 3), 10000 ** (-2 / 3), 1e-4])
    angles = 1000 * t.unsqueeze(1) * frequencies
    torch.testing.assert_close(embedding, torch.cat([angles.sin(), angles.cos()], dim=1))


@torch.no_grad()
def test_a_saved_state_dict_loads_strictly(estimator, tmp_path):
    torch.save(estimator.state_dict(), tmp_path / "estimator.pt")
    torch.manual_seed(1)
    reloaded = UNetEstimator(TINY).eval()
    reloaded.load_state_dict(torch.load(tmp_path / "estimator.pt"), strict=True)
    inputs = random_inputs([9], seed=5)
    torch.testing.assert_close(reloaded(**inputs), estimator(**inputs), atol=0, rtol=0)
    partial = dict(estimator.state_dict())
    del partial["final_proj.weight"]
    with pytest.raises(RuntimeError, match="final_proj.weight"):
        reloaded.load_state_dict(partial, strict=True)


def official_estimator_shapes() -> dict[str, tuple[int, ...]]:
    """``decoder.estimator.*`` of CosyVoice2's flow.pt, prefix stripped (910 tensors, 71,302,480 elements)."""
    shapes: dict[str, tuple[int, ...]] = {
        "time_mlp.linear_1.weight": (1024, 320),
        "time_mlp.linear_1.bias": (1024,),
        "time_mlp.linear_2.weight": (1024, 1024),
        "time_mlp.linear_2.bias": (1024,),
        "final_block.block.0.weight": (256, 256, 3),
        "final_block.block.0.bias": (256,),
        "final_block.block.2.weight": (256,),
        "final_block.block.2.bias": (256,),
        "final_proj.weight": (80, 256, 1),
        "final_proj.bias": (80,),
    }

    def stage(prefix: str, in_channels: int, with_conv: bool) -> None:
        resnet = {
            "mlp.1.weight": (256, 1024),
            "mlp.1.bias": (256,),
            "block1.block.0.weight": (256, in_channels, 3),
            "block2.block.0.weight": (256, 256, 3),
            "res_conv.weight": (256, in_channels, 1),
            "res_conv.bias": (256,),
        }
        for block in ("block1", "block2"):
            resnet |= {f"{block}.block.0.bias": (256,)}
            resnet |= {f"{block}.block.2.{name}": (256,) for name in ("weight", "bias")}
        shapes.update({f"{prefix}.0.{name}": shape for name, shape in resnet.items()})
        transformer = {
            "attn1.to_q.weight": (512, 256),
            "attn1.to_k.weight": (512, 256),
            "attn1.to_v.weight": (512, 256),
            "attn1.to_out.0.weight": (256, 512),
            "attn1.to_out.0.bias": (256,),
            "ff.net.0.proj.weight": (1024, 256),
            "ff.net.0.proj.bias": (1024,),
            "ff.net.2.weight": (256, 1024),
            "ff.net.2.bias": (256,),
        }
        for norm in ("norm1", "norm3"):
            transformer |= {f"{norm}.weight": (256,), f"{norm}.bias": (256,)}
        for index in range(4):
            shapes.update({f"{prefix}.1.{index}.{name}": shape for name, shape in transformer.items()})
        if with_conv:
            shapes.update({f"{prefix}.2.weight": (256, 256, 3), f"{prefix}.2.bias": (256,)})

    stage("down_blocks.0", 320, with_conv=True)
    for index in range(12):
        stage(f"mid_blocks.{index}", 256, with_conv=False)
    stage("up_blocks.0", 512, with_conv=True)
    return shapes


def test_the_full_size_state_dict_has_the_official_keys_and_shapes():
    state = UNetEstimator().state_dict()
    expected = official_estimator_shapes()
    assert len(expected) == 910 and sum(math.prod(shape) for shape in expected.values()) == 71_302_480
    assert {name: tuple(value.shape) for name, value in state.items()} == expected


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"channels": (256, 256)}, "one channel level"),
        ({"in_channels": 240}, "not 4 x out_channels"),
        ({"act_fn": "snake"}, "act_fn 'snake'"),
        ({"static_chunk_size": 0}, "static_chunk_size must be positive"),
    ],
)
def test_unsupported_configs_are_refused(changes, problem):
    with pytest.raises(UsageError, match=problem):
        UNetEstimatorConfig(**changes)
