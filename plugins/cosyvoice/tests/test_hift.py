"""CosyVoice's HiFT vocoders on tiny random weights: lengths, the causal prefix property, padding, noise, checkpoint
keys in both weight-norm styles, and CosyVoice2's streaming cross-fade."""

from __future__ import annotations

import pytest
import torch
from trtdeploy_cosyvoice.token2wav.hift import (
    NOISE_TABLE_ROWS,
    STREAM_SAMPLE_CACHE,
    CausalHiFTConfig,
    CausalHiFTGenerator,
    FixedNoiseTable,
    HiFTConfig,
    HiFTGenerator,
    StreamCache,
    crossfade,
    gaussian_source_noise,
    stream_vocode,
)

from trtdeploy.errors import UsageError

SAMPLES_PER_FRAME = 480
TINY = {"base_channels": 32, "f0_predictor": {"cond_channels": 32}}
#: The F0 classifier is scaled so that F0 spans voiced and unvoiced frames (random weights give F0 near 0 Hz, all
#: unvoiced, which would leave the sine branch untested).
F0_SCALE = 300.0


def tiny(causal: bool, seed: int = 0) -> HiFTGenerator | CausalHiFTGenerator:
    torch.manual_seed(seed)
    model = CausalHiFTGenerator(CausalHiFTConfig(**TINY)) if causal else HiFTGenerator(HiFTConfig(**TINY))
    with torch.no_grad():
        model.f0_predictor.classifier.weight.mul_(F0_SCALE)
    return model.eval()


@pytest.fixture(scope="module")
def v2() -> HiFTGenerator:
    return tiny(causal=False)


@pytest.fixture(scope="module")
def v3() -> CausalHiFTGenerator:
    return tiny(causal=True)


def mel(batch: int, frames: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(batch, 80, frames, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_defaults_are_the_released_models():
    v2_config, v3_config = HiFTConfig(), CausalHiFTConfig()
    assert v2_config.samples_per_frame == v3_config.samples_per_frame == SAMPLES_PER_FRAME
    assert (v2_config.base_channels, v2_config.upsample_rates, v2_config.source_resblock_kernel_sizes) == (
        512,
        (8, 5, 3),
        (7, 7, 11),
    )
    assert dict(v2_config.istft_params) == {"n_fft": 16, "hop_len": 4} and v3_config.conv_pre_look_right == 4
    with pytest.raises(UsageError, match="9 columns"):
        CausalHiFTConfig(nb_harmonics=7)
    with pytest.raises(UsageError, match="istft_params"):
        HiFTConfig(istft_params={"n_fft": 16})


@pytest.mark.parametrize(
    ("causal", "tensors", "shapes"),
    [
        (
            False,
            20_821_295,
            {
                "conv_pre.parametrizations.weight.original1": (512, 80, 7),
                "ups.0.parametrizations.weight.original0": (512, 1, 1),
                "ups.0.parametrizations.weight.original1": (512, 256, 16),
                "source_downs.0.weight": (256, 18, 30),
                "resblocks.8.activations2.2.alpha": (64,),
                "conv_post.parametrizations.weight.original1": (18, 64, 7),
                "f0_predictor.condnet.0.parametrizations.weight.original1": (512, 80, 3),
                "m_source.l_linear.weight": (1, 9),
            },
        ),
        (
            True,
            20_779_887,
            {
                "conv_pre.parametrizations.weight.original1": (512, 80, 5),
                "ups.0.parametrizations.weight.original0": (256, 1, 1),
                "ups.0.parametrizations.weight.original1": (256, 512, 16),
                "source_downs.2.weight": (64, 18, 1),
                "f0_predictor.condnet.0.parametrizations.weight.original1": (512, 80, 4),
                "f0_predictor.classifier.weight": (1, 512),
            },
        ),
    ],
)
def test_released_size_has_the_checkpoint_keys(causal, tensors, shapes):
    model = CausalHiFTGenerator() if causal else HiFTGenerator()
    state = model.state_dict()
    assert len(state) == 328 and sum(value.numel() for value in state.values()) == tensors
    assert {name: tuple(state[name].shape) for name in shapes} == shapes


def test_v2_gives_480_samples_a_frame(v2):
    with torch.inference_mode():
        out = v2(mel(1, 30, seed=1))
    assert out.speech.shape == (1, 30 * SAMPLES_PER_FRAME) and out.lengths.tolist() == [30 * SAMPLES_PER_FRAME]
    assert out.source.shape == (1, 1, 30 * SAMPLES_PER_FRAME)
    assert torch.isfinite(out.speech).all() and 1e-4 < float(out.speech.std()) and float(out.speech.abs().max()) < 0.99


def test_v3_not_finalized_is_a_prefix_of_the_finalized_audio(v3):
    full_mel = mel(1, 40, seed=2)
    with torch.inference_mode():
        full = v3(full_mel)
        assert full.speech.shape == (1, 40 * SAMPLES_PER_FRAME) and torch.isfinite(full.speech).all()
        for frames in (12, 25, 40):
            part = v3(full_mel[:, :, :frames], finalize=False)
            assert part.lengths.tolist() == [(frames - 8) * SAMPLES_PER_FRAME]
            # float32 convolutions of other lengths round differently; a lookahead or padding error is ~1e-2
            torch.testing.assert_close(part.speech, full.speech[:, : part.speech.shape[1]], atol=2e-6, rtol=0)
        # finalizing uses zeros as lookahead: the last 8 frames' audio is what later frames change
        finalized_prefix = v3(full_mel[:, :, :25]).speech
        assert (
            float((finalized_prefix[:, -8 * SAMPLES_PER_FRAME :] - full.speech[:, 17 * 480 : 25 * 480]).abs().max())
            > 1e-3
        )
    with pytest.raises(UsageError, match="too short for finalize=False"):
        v3(full_mel[:, :, :7], finalize=False)


def padded_batch(lengths: list[int], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """A right-padded mel batch whose padding holds large garbage, which no row may see."""
    batch = mel(len(lengths), max(lengths), seed, dtype)
    for row, length in enumerate(lengths):
        batch[row, :, length:] = 1e3
    return batch


@pytest.mark.parametrize("causal", [False, True])
def test_a_batch_row_is_the_row_alone(causal):
    """In float64, so that any padding leak shows (float32 convolutions round differently at another batch size:
    measured up to 4e-5 for CosyVoice2, whose phase integrates F0, and 2e-7 for CosyVoice3)."""
    model = tiny(causal).double()
    lengths, finalize = [40, 33, 21], [True, False, True]
    batch = padded_batch(lengths, seed=3, dtype=torch.float64)
    noise = gaussian_source_noise(3, 40 * SAMPLES_PER_FRAME).double()
    extra = {"finalize": torch.tensor(finalize)} if causal else {"noise": noise}
    with torch.inference_mode():
        out = model(batch, torch.tensor(lengths), **extra)
        for row, length in enumerate(lengths):
            extra = {"finalize": finalize[row]} if causal else {"noise": noise[row : row + 1]}
            alone = model(batch[row : row + 1, :, :length], **extra)
            count = int(alone.lengths[0])
            assert int(out.lengths[row]) == count
            torch.testing.assert_close(out.speech[row, :count], alone.speech[0], atol=1e-12, rtol=0)
            assert not out.speech[row, count:].any()


def test_v2_noise_is_injectable_and_seedable(v2):
    frames = 20
    inputs = mel(2, frames, seed=4)
    samples = frames * SAMPLES_PER_FRAME
    with torch.inference_mode():
        noise = gaussian_source_noise(2, samples, generator=torch.Generator().manual_seed(7))
        given = v2(inputs, noise=noise).speech
        seeded = v2(inputs, generator=torch.Generator().manual_seed(7)).speech
        other_seed = v2(inputs, generator=torch.Generator().manual_seed(8)).speech
        fresh = [v2(inputs).speech for _ in range(2)]
    torch.testing.assert_close(seeded, given, atol=0, rtol=0)
    assert float((other_seed - given).abs().max()) > 1e-4
    assert float((fresh[0] - fresh[1]).abs().max()) > 1e-4  # the default: fresh noise every call, as upstream
    with pytest.raises(UsageError, match="does not cover"):
        v2(inputs, noise=noise[:, :-1])


def test_gaussian_noise_is_drawn_as_upstream_draws_it():
    """Upstream draws ``randn_like`` of a harmonic-major tensor seen transposed; torch fills that layout element by
    element, so its values differ from a plain ``randn`` of the same shape."""
    generator = torch.Generator().manual_seed(0)
    expected = torch.empty(2, 9, 100).transpose(1, 2).normal_(generator=generator)
    noise = gaussian_source_noise(2, 100, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(noise, expected, atol=0, rtol=0)
    assert not torch.equal(noise, torch.randn(2, 100, 9, generator=torch.Generator().manual_seed(0)))


def test_v2_cache_source_replaces_the_start_of_the_excitation(v2):
    frames, cached = 20, STREAM_SAMPLE_CACHE
    inputs = mel(2, frames, seed=5)
    noise = gaussian_source_noise(2, frames * SAMPLES_PER_FRAME)
    cache = torch.rand(2, 1, cached) - 0.5
    with torch.inference_mode():
        plain = v2(inputs, noise=noise)
        cached_out = v2(inputs, noise=noise, cache_source=cache, cache_source_lengths=torch.tensor([cached, 0]))
    torch.testing.assert_close(cached_out.source[0, :, :cached], cache[0], atol=0, rtol=0)
    torch.testing.assert_close(cached_out.source[0, :, cached:], plain.source[0, :, cached:], atol=0, rtol=0)
    torch.testing.assert_close(cached_out.speech[1], plain.speech[1], atol=0, rtol=0)
    assert float((cached_out.speech[0] - plain.speech[0]).abs().max()) > 1e-4


def test_fixed_noise_table_is_the_official_tables_rows():
    """The official table's first and last rows, from upstream's model built by its cosyvoice3.yaml."""
    before = torch.get_rng_state()
    table = FixedNoiseTable()
    first = table.rows(1000, "cpu").clone()
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is untouched
    expected_first = [0.92282599, 0.47744751, 0.82705182, 0.28345716, 0.79348159, 0.17343479, 0.85237503, 0.92285460]
    torch.testing.assert_close(first[0, :8], torch.tensor(expected_first), atol=1e-7, rtol=0)
    grown = table.rows(300_001, "cpu")  # drawn on from where the first call stopped
    torch.testing.assert_close(grown[:1000], first, atol=0, rtol=0)
    torch.testing.assert_close(FixedNoiseTable().rows(300_001, "cpu"), grown, atol=0, rtol=0)
    with pytest.raises(UsageError, match="300 s"):
        table.rows(NOISE_TABLE_ROWS + 1, "cpu")


def test_the_noise_tables_last_official_row():
    last = FixedNoiseTable().rows(NOISE_TABLE_ROWS, "cpu")[-1]
    expected = [0.17419535, 0.88941050, 0.69583881, 0.31940234, 0.06524700, 0.84146869, 0.64536279, 0.77190685]
    torch.testing.assert_close(last[:8], torch.tensor(expected), atol=1e-7, rtol=0)


def weight_norm_old_style(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The keys of torch's former weight norm: ``X.weight_g`` / ``X.weight_v``."""
    renamed = {}
    for name, value in state.items():
        name = name.replace(".parametrizations.weight.original0", ".weight_g")
        renamed[name.replace(".parametrizations.weight.original1", ".weight_v")] = value
    return renamed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("old_style", [False, True])
def test_a_saved_state_dict_loads_strictly(tmp_path, causal, old_style):
    source = tiny(causal, seed=1)
    state = source.state_dict()
    if old_style:
        state = weight_norm_old_style(state)
        assert any(name.endswith(".weight_g") for name in state)
    torch.save(state, tmp_path / "hift.pt")
    loaded = tiny(causal, seed=2)
    loaded.load_state_dict(torch.load(tmp_path / "hift.pt", weights_only=True), strict=True)
    inputs = mel(1, 16, seed=6)
    extra = {} if causal else {"noise": gaussian_source_noise(1, 16 * SAMPLES_PER_FRAME)}
    with torch.inference_mode():
        torch.testing.assert_close(loaded(inputs, **extra).speech, source(inputs, **extra).speech, atol=0, rtol=0)
    assert loaded.state_dict().keys() == source.state_dict().keys()


@pytest.mark.parametrize("causal", [False, True])
def test_folding_weight_norm_keeps_the_output(causal):
    model = tiny(causal, seed=3)
    inputs = mel(1, 16, seed=7)
    extra = {} if causal else {"noise": gaussian_source_noise(1, 16 * SAMPLES_PER_FRAME)}
    with torch.inference_mode():
        before = model(inputs, **extra).speech
        model.fold_weight_norm()
        after = model(inputs, **extra).speech
    assert not any("parametrizations" in name for name in model.state_dict())
    assert "conv_pre.weight" in model.state_dict()
    torch.testing.assert_close(after, before, atol=1e-6, rtol=0)


def test_crossfade_blends_hamming_halves():
    overlap = 8
    window = torch.hamming_window(2 * overlap, periodic=False, dtype=torch.float64)
    rising = crossfade(torch.ones(20), torch.zeros(overlap))
    falling = crossfade(torch.zeros(20), torch.ones(overlap))
    torch.testing.assert_close(rising[:overlap], window[:overlap].float(), atol=0, rtol=0)
    torch.testing.assert_close(falling[:overlap], window[overlap:].float(), atol=0, rtol=0)
    assert rising.shape == (20,) and bool((rising[overlap:] == 1).all()) and not falling[overlap:].any()


def stream(model, chunks, noises=None):
    """One request streamed chunk by chunk; returns the emitted pieces."""
    pieces, cache = [], None
    for index, chunk in enumerate(chunks):
        final = index == len(chunks) - 1
        noise = None if noises is None else noises[index]
        [(speech, cache)] = stream_vocode(model, [chunk], [cache], [final], noise=noise)
        assert (cache is None) == final
        pieces.append(speech)
    return pieces


def test_streamed_chunks_join_to_the_offline_length(v2):
    whole = mel(1, 75, seed=8)[0]
    chunks = [whole[:, :20], whole[:, 20:45], whole[:, 45:]]
    with torch.inference_mode():
        pieces = stream(v2, chunks)
    assert [piece.shape[0] for piece in pieces] == [20 * 480 - 3840, 25 * 480, 30 * 480 + 3840]
    assert sum(piece.shape[0] for piece in pieces) == 75 * SAMPLES_PER_FRAME
    assert all(torch.isfinite(piece).all() for piece in pieces)


def test_batched_streaming_calls_equal_each_requests_own(v2):
    """Two requests at different points of their streams (one starting, one finishing) vocoded together."""
    first, second = mel(1, 30, seed=9)[0], mel(1, 50, seed=10)[0]
    noise_a = gaussian_source_noise(1, 30 * 480, generator=torch.Generator().manual_seed(1))
    noise_b = [gaussian_source_noise(1, 38 * 480, generator=torch.Generator().manual_seed(seed)) for seed in (2, 3)]
    with torch.inference_mode():
        [(_, cache)] = stream_vocode(v2, [second[:, :20]], [None], [False], noise=noise_b[0][:, : 20 * 480])
        alone_first = stream_vocode(v2, [first], [None], [False], noise=noise_a)
        alone_second = stream_vocode(v2, [second[:, 20:]], [cache], [True], noise=noise_b[1])
        noise = torch.zeros(2, 38 * 480, 9)
        noise[0, : 30 * 480], noise[1] = noise_a[0], noise_b[1][0]
        together = stream_vocode(v2, [first, second[:, 20:]], [None, cache], [False, True], noise=noise)
    (speech_a, cache_a), (speech_b, cache_b) = together
    assert cache_b is None and isinstance(cache_a, StreamCache)
    # float32 convolutions at batch size 2 round differently from batch size 1
    torch.testing.assert_close(speech_a, alone_first[0][0], atol=1e-4, rtol=0)
    torch.testing.assert_close(speech_b, alone_second[0][0], atol=1e-4, rtol=0)
    torch.testing.assert_close(cache_a.source, alone_first[0][1].source, atol=1e-4, rtol=0)
    assert speech_b.shape == (30 * 480 + 3840,)
