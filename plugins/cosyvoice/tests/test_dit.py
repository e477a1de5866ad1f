"""CosyVoice3's DiT estimator at tiny sizes: shapes, batching, streaming chunks, checkpoint keys."""

from __future__ import annotations

import pytest
import torch
from trtdeploy_cosyvoice.token2wav.dit import DiTEstimator, DiTEstimatorConfig, RotaryEmbedding

from trtdeploy.errors import UsageError

TINY = DiTEstimatorConfig(
    dim=32, depth=2, heads=2, dim_head=8, ff_mult=2, mel_dim=6, mu_dim=6, spk_dim=6, out_channels=6, static_chunk_size=4
)


def _estimator(seed: int = 0) -> DiTEstimator:
    torch.manual_seed(seed)
    return DiTEstimator(TINY).eval()


def _inputs(lengths: list[int], frames: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random inputs, right padded with random values (not zeros), so that leaking padding would show."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(lengths)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    mask = (torch.arange(frames) < torch.tensor(lengths).unsqueeze(1)).unsqueeze(1).float()
    return {
        "x": randn(batch, TINY.mel_dim, frames),
        "mask": mask,
        "mu": randn(batch, TINY.mu_dim, frames),
        "t": torch.rand(batch, generator=generator),
        "spks": randn(batch, TINY.spk_dim),
        "cond": randn(batch, TINY.mel_dim, frames),
    }


def _row(inputs: dict[str, torch.Tensor], row: int, frames: int) -> dict[str, torch.Tensor]:
    """Row ``row`` alone, cut to its first ``frames`` frames."""
    alone = {name: value[row : row + 1] for name, value in inputs.items()}
    for name in ("x", "mask", "mu", "cond"):
        alone[name] = alone[name][..., :frames]
    return alone


@pytest.mark.parametrize("streaming", [False, True])
def test_output_has_mel_shape_and_is_finite(streaming: bool) -> None:
    inputs = _inputs([13, 9], frames=13)
    with torch.no_grad():
        velocity = _estimator()(**inputs, streaming=streaming)
    assert velocity.shape == (2, TINY.mel_dim, 13)
    assert velocity.isfinite().all()
    assert velocity[0].std() > 0.1


@pytest.mark.parametrize("streaming", [False, True])
def test_batch_rows_equal_each_row_alone(streaming: bool) -> None:
    lengths = [11, 7, 3]
    inputs = _inputs(lengths, frames=11)
    estimator = _estimator()
    with torch.no_grad():
        batched = estimator(**inputs, streaming=streaming)
        for row, length in enumerate(lengths):
            alone = estimator(**_row(inputs, row, length), streaming=streaming)
            torch.testing.assert_close(batched[row : row + 1, :, :length], alone, rtol=0, atol=1e-5)


def test_streaming_prefix_on_the_chunk_grid_is_unchanged_by_later_frames() -> None:
    chunk = TINY.static_chunk_size
    inputs = _inputs([5 * chunk], frames=5 * chunk)
    estimator = _estimator()
    with torch.no_grad():
        whole = estimator(**inputs, streaming=True)
        whole_full_attention = estimator(**inputs, streaming=False)
        on_grid = estimator(**_row(inputs, 0, 2 * chunk), streaming=True)
        off_grid = estimator(**_row(inputs, 0, 2 * chunk + 1), streaming=True)
    torch.testing.assert_close(on_grid, whole[..., : 2 * chunk], rtol=0, atol=1e-5)
    # The frame that starts a chunk sees the rest of its chunk, so cutting inside a chunk changes it...
    assert not torch.allclose(off_grid[..., -1], whole[..., 2 * chunk], atol=1e-3)
    # ...but not the chunks before.
    torch.testing.assert_close(off_grid[..., : 2 * chunk], whole[..., : 2 * chunk], rtol=0, atol=1e-5)
    # Without streaming every frame sees the whole sequence.
    assert not torch.allclose(whole_full_attention[..., :chunk], whole[..., :chunk], atol=1e-3)


def test_rotary_embedding_turns_only_the_first_head_channels() -> None:
    rotary = RotaryEmbedding(8)
    x = torch.randn(1, 5, 24)
    turned = rotary.rotate(x, rotary.angles(5))
    torch.testing.assert_close(turned[..., 8:], x[..., 8:], rtol=0, atol=0)
    torch.testing.assert_close(turned[:, 0], x[:, 0], rtol=0, atol=0)
    assert not torch.allclose(turned[:, 1:, :8], x[:, 1:, :8])
    # A rotation keeps each pair's length.
    torch.testing.assert_close(
        turned[..., :8].unflatten(-1, (4, 2)).norm(dim=-1), x[..., :8].unflatten(-1, (4, 2)).norm(dim=-1)
    )


def test_saved_state_dict_loads_strictly_and_gives_the_same_output(tmp_path) -> None:
    path = tmp_path / "estimator.pt"
    torch.save(_estimator(seed=0).state_dict(), path)
    loaded = _estimator(seed=5)
    loaded.load_state_dict(torch.load(path), strict=True)
    assert "rotary_embed.inv_freq" in torch.load(path)
    inputs = _inputs([9], frames=9)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs), _estimator(seed=0)(**inputs), rtol=0, atol=0)


def _official_estimator_shapes() -> dict[str, tuple[int, ...]]:
    """The ``decoder.estimator.`` tensors of CosyVoice3's flow.pt, prefix stripped."""
    shapes: dict[str, tuple[int, ...]] = {
        "time_embed.time_mlp.0.weight": (1024, 256),
        "time_embed.time_mlp.0.bias": (1024,),
        "time_embed.time_mlp.2.weight": (1024, 1024),
        "time_embed.time_mlp.2.bias": (1024,),
        "input_embed.proj.weight": (1024, 320),
        "input_embed.proj.bias": (1024,),
        "input_embed.conv_pos_embed.conv1.0.weight": (1024, 64, 31),
        "input_embed.conv_pos_embed.conv1.0.bias": (1024,),
        "input_embed.conv_pos_embed.conv2.0.weight": (1024, 64, 31),
        "input_embed.conv_pos_embed.conv2.0.bias": (1024,),
        "rotary_embed.inv_freq": (32,),
        "norm_out.linear.weight": (2048, 1024),
        "norm_out.linear.bias": (2048,),
        "proj_out.weight": (80, 1024),
        "proj_out.bias": (80,),
    }
    block_shapes = {
        "attn_norm.linear": (6144, 1024),
        "attn.to_q": (1024, 1024),
        "attn.to_k": (1024, 1024),
        "attn.to_v": (1024, 1024),
        "attn.to_out.0": (1024, 1024),
        "ff.ff.0.0": (2048, 1024),
        "ff.ff.2": (1024, 2048),
    }
    for block in range(22):
        for name, shape in block_shapes.items():
            shapes[f"transformer_blocks.{block}.{name}.weight"] = shape
            shapes[f"transformer_blocks.{block}.{name}.bias"] = shape[:1]
    return shapes


def test_full_size_parameters_are_the_official_checkpoint_keys() -> None:
    with torch.device("meta"):
        estimator = DiTEstimator()
    shapes = {name: tuple(tensor.shape) for name, tensor in estimator.state_dict().items()}
    assert len(shapes) == 323
    assert shapes == _official_estimator_shapes()


def test_rotary_frequencies_are_the_official_buffer() -> None:
    inv_freq = DiTEstimator(TINY).rotary_embed.inv_freq
    torch.testing.assert_close(inv_freq, 10000.0 ** -(torch.arange(0, 8, 2) / 8.0))


def test_out_channels_other_than_mel_dim_is_refused() -> None:
    with pytest.raises(UsageError, match="out_channels 40 differs from mel_dim 80"):
        DiTEstimatorConfig(out_channels=40)
