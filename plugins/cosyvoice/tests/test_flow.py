"""The flow of both generations (token embedding, CosyVoice2's upsampling conformer or CosyVoice3's lookahead
convolution, the flow-matching solver) on tiny random weights: shapes, batching, streaming on the chunk grid,
checkpoint keys, and the solver's fixed noise."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from trtdeploy_cosyvoice.token2wav.cfm import NOISE_FRAMES, CFMParams, ConditionalFlowMatching
from trtdeploy_cosyvoice.token2wav.conformer import (
    RelPositionMultiHeadedAttention,
    UpsampleConformerEncoderConfig,
    attention_mask,
    relative_position_table,
)
from trtdeploy_cosyvoice.token2wav.flow import (
    CosyVoice2Flow,
    CosyVoice2FlowConfig,
    CosyVoice3Flow,
    CosyVoice3FlowConfig,
    match_prompt_lengths,
)

MEL = 8
SPEAKER = 6
VOCAB = 50
#: Streaming chunk in tokens (the estimator's is twice that, in mel frames).
CHUNK = 4
LOOKAHEAD = 3
TINY_V2 = CosyVoice2FlowConfig(
    input_size=16,
    output_size=MEL,
    spk_embed_dim=SPEAKER,
    vocab_size=VOCAB,
    encoder=UpsampleConformerEncoderConfig(
        input_size=16,
        output_size=16,
        attention_heads=2,
        linear_units=32,
        num_blocks=2,
        static_chunk_size=CHUNK,
        num_up_blocks=2,
    ),
)
TINY_V3 = CosyVoice3FlowConfig(
    input_size=MEL, output_size=MEL, spk_embed_dim=SPEAKER, vocab_size=VOCAB, pre_lookahead_channels=16
)


class TinyEstimator(nn.Module):
    """A small velocity network with the estimators' interface: a per-frame projection of ``[x, mu, spks, cond, t]``
    and one attention head over the frames, all of them or (streaming) the chunks up to its own."""

    def __init__(self, mel: int, chunk: int, hidden: int = 16):
        super().__init__()
        self.chunk = chunk
        self.proj = nn.Conv1d(4 * mel + 1, hidden, kernel_size=1)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Conv1d(hidden, mel, kernel_size=1)

    def forward(self, x, mask, mu, t, spks, cond, streaming: bool):
        frames = x.size(2)
        time = t[:, None, None].expand(-1, 1, frames)
        speaker = spks[:, :, None].expand(-1, -1, frames)
        hidden = torch.tanh(self.proj(torch.cat([x, mu, speaker, cond, time], dim=1))).transpose(1, 2)
        queries, keys, values = self.qkv(hidden).chunk(3, dim=-1)
        scores = queries @ keys.transpose(1, 2) / math.sqrt(hidden.size(-1))
        lengths = mask[:, 0].sum(-1).long()
        visible = attention_mask(lengths, frames, self.chunk if streaming else None)
        weights = scores.masked_fill(~visible, -float("inf")).softmax(-1)
        return self.out((hidden + weights @ values).transpose(1, 2)) * mask


def build(generation: str, seed: int = 0) -> CosyVoice2Flow | CosyVoice3Flow:
    torch.manual_seed(seed)
    estimator = TinyEstimator(MEL, 2 * CHUNK)
    if generation == "v2":
        return CosyVoice2Flow(TINY_V2, estimator).eval()
    return CosyVoice3Flow(TINY_V3, estimator).eval()


@pytest.fixture(scope="module", params=["v2", "v3"])
def flow(request) -> CosyVoice2Flow | CosyVoice3Flow:
    return build(request.param)


def random_request(prompt_tokens: int, tokens: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "prompt_tokens": torch.randint(0, VOCAB, (prompt_tokens,), generator=generator),
        "tokens": torch.randint(0, VOCAB, (tokens,), generator=generator),
        "prompt_mel": torch.randn(2 * prompt_tokens, MEL, generator=generator),
        "embedding": torch.randn(SPEAKER, generator=generator),
    }


def batch(requests: list[dict[str, torch.Tensor]], *, garbage: bool = True) -> dict[str, torch.Tensor]:
    """Right-padded inputs of ``flow.inference``; the padding holds valid token ids and large mel values that no
    row may see."""
    generator = torch.Generator().manual_seed(99)

    def padded(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [request[name] for request in requests]
        lengths = torch.tensor([len(row) for row in rows])
        if name == "prompt_mel":
            out = 1e3 * torch.randn(len(rows), int(lengths.max()), MEL, generator=generator)
        else:
            out = torch.randint(0, VOCAB, (len(rows), int(lengths.max())), generator=generator)
        if not garbage:
            out.zero_()
        for index, row in enumerate(rows):
            out[index, : len(row)] = row
        return out, lengths

    tokens, token_lengths = padded("tokens")
    prompt_tokens, prompt_token_lengths = padded("prompt_tokens")
    prompt_mels, prompt_mel_lengths = padded("prompt_mel")
    return {
        "tokens": tokens,
        "token_lengths": token_lengths,
        "prompt_tokens": prompt_tokens,
        "prompt_token_lengths": prompt_token_lengths,
        "prompt_mels": prompt_mels,
        "prompt_mel_lengths": prompt_mel_lengths,
        "embeddings": torch.stack([request["embedding"] for request in requests]),
    }


def run(flow, requests, *, streaming: bool, finalize: bool) -> list[torch.Tensor]:
    return flow.inference(**batch(requests), streaming=streaming, finalize=finalize)


@pytest.mark.parametrize(("streaming", "finalize"), [(False, True), (True, True), (True, False)])
def test_each_row_gets_the_mel_of_its_target_tokens(flow, streaming, finalize):
    requests = [random_request(5, 9, seed=1), random_request(2, 14, seed=2)]
    mels = run(flow, requests, streaming=streaming, finalize=finalize)
    lookahead = 0 if finalize else LOOKAHEAD
    assert [tuple(mel.shape) for mel in mels] == [(MEL, 2 * (9 - lookahead)), (MEL, 2 * (14 - lookahead))]
    assert all(mel.dtype == torch.float32 and torch.isfinite(mel).all() for mel in mels)


@pytest.mark.parametrize(("streaming", "finalize"), [(False, True), (True, False)])
def test_a_batch_gives_each_row_what_it_gives_alone(flow, streaming, finalize):
    requests = [random_request(5, 9, seed=3), random_request(2, 14, seed=4), random_request(7, 4, seed=5)]
    together = run(flow, requests, streaming=streaming, finalize=finalize)
    for request, mel in zip(requests, together, strict=True):
        (alone,) = run(flow, [request], streaming=streaming, finalize=finalize)
        torch.testing.assert_close(mel, alone, atol=1e-5, rtol=1e-5)


def test_a_streaming_call_on_the_chunk_grid_gives_the_frames_of_the_full_streaming_run(flow):
    request = random_request(CHUNK, 5 * CHUNK, seed=6)
    (full,) = run(flow, [request], streaming=True, finalize=True)
    for cut in (CHUNK, 3 * CHUNK):
        prefix = {**request, "tokens": request["tokens"][: cut + LOOKAHEAD]}
        (partial,) = run(flow, [prefix], streaming=True, finalize=False)
        assert partial.shape[1] == 2 * cut
        torch.testing.assert_close(partial, full[:, : 2 * cut], atol=1e-5, rtol=1e-5)
    # Off the grid, the prefix's last chunk sees less than the same chunk does in the full run.
    cut = 2 * CHUNK + 1
    (partial,) = run(
        flow, [{**request, "tokens": request["tokens"][: cut + LOOKAHEAD]}], streaming=True, finalize=False
    )
    assert not torch.allclose(partial, full[:, : 2 * cut], atol=1e-4)
    (offline,) = run(flow, [request], streaming=False, finalize=True)
    assert not torch.allclose(offline, full, atol=1e-4)


def test_the_lookahead_tokens_shape_the_last_frames(flow):
    request = random_request(3, 10, seed=7)
    (with_lookahead,) = run(flow, [request], streaming=False, finalize=False)
    (cut_short,) = run(flow, [{**request, "tokens": request["tokens"][:-LOOKAHEAD]}], streaming=False, finalize=True)
    assert with_lookahead.shape == cut_short.shape
    assert not torch.allclose(with_lookahead[:, -2:], cut_short[:, -2:], atol=1e-4)


@pytest.mark.parametrize("generation", ["v2", "v3"])
def test_a_saved_state_dict_loads_strictly_and_reproduces_the_outputs(generation, tmp_path):
    original, other = build(generation, seed=0), build(generation, seed=1)
    path = tmp_path / "flow.pt"
    torch.save(original.state_dict(), path)
    other.load_state_dict(torch.load(path, weights_only=True), strict=True)
    assert not any(name.endswith("noise") for name in original.state_dict())
    requests = [random_request(4, 8, seed=8)]
    for expected, got in zip(
        run(original, requests, streaming=True, finalize=False),
        run(other, requests, streaming=True, finalize=False),
        strict=True,
    ):
        assert torch.equal(expected, got)


def _conformer_layer_keys(prefix: str, size: int, heads: int, units: int) -> dict[str, tuple[int, ...]]:
    linear = {
        f"{prefix}.self_attn.linear_{name}.{kind}": shape
        for name in "qkv"
        for kind, shape in (("weight", (size, size)), ("bias", (size,)))
    }
    return {
        **linear,
        f"{prefix}.self_attn.linear_out.weight": (size, size),
        f"{prefix}.self_attn.linear_out.bias": (size,),
        f"{prefix}.self_attn.linear_pos.weight": (size, size),
        f"{prefix}.self_attn.pos_bias_u": (heads, size // heads),
        f"{prefix}.self_attn.pos_bias_v": (heads, size // heads),
        f"{prefix}.feed_forward.w_1.weight": (units, size),
        f"{prefix}.feed_forward.w_1.bias": (units,),
        f"{prefix}.feed_forward.w_2.weight": (size, units),
        f"{prefix}.feed_forward.w_2.bias": (size,),
        f"{prefix}.norm_ff.weight": (size,),
        f"{prefix}.norm_ff.bias": (size,),
        f"{prefix}.norm_mha.weight": (size,),
        f"{prefix}.norm_mha.bias": (size,),
    }


def official_v2_keys() -> dict[str, tuple[int, ...]]:
    """The released CosyVoice2 ``flow.pt`` outside ``decoder.estimator.``: names and shapes."""
    keys = {
        "input_embedding.weight": (6561, 512),
        "spk_embed_affine_layer.weight": (80, 192),
        "spk_embed_affine_layer.bias": (80,),
        "encoder_proj.weight": (80, 512),
        "encoder_proj.bias": (80,),
        "encoder.after_norm.weight": (512,),
        "encoder.after_norm.bias": (512,),
        "encoder.pre_lookahead_layer.conv1.weight": (512, 512, 4),
        "encoder.pre_lookahead_layer.conv1.bias": (512,),
        "encoder.pre_lookahead_layer.conv2.weight": (512, 512, 3),
        "encoder.pre_lookahead_layer.conv2.bias": (512,),
        "encoder.up_layer.conv.weight": (512, 512, 5),
        "encoder.up_layer.conv.bias": (512,),
    }
    for embed in ("embed", "up_embed"):
        keys |= {
            f"encoder.{embed}.out.0.weight": (512, 512),
            f"encoder.{embed}.out.0.bias": (512,),
            f"encoder.{embed}.out.1.weight": (512,),
            f"encoder.{embed}.out.1.bias": (512,),
        }
    for stack, count in (("encoders", 6), ("up_encoders", 4)):
        for index in range(count):
            keys |= _conformer_layer_keys(f"encoder.{stack}.{index}", 512, 8, 2048)
    return keys


def official_v3_keys() -> dict[str, tuple[int, ...]]:
    """The released CosyVoice3 ``flow.pt`` outside ``decoder.estimator.``: names and shapes."""
    return {
        "input_embedding.weight": (6561, 80),
        "spk_embed_affine_layer.weight": (80, 192),
        "spk_embed_affine_layer.bias": (80,),
        "pre_lookahead_layer.conv1.weight": (1024, 80, 4),
        "pre_lookahead_layer.conv1.bias": (1024,),
        "pre_lookahead_layer.conv2.weight": (80, 1024, 3),
        "pre_lookahead_layer.conv2.bias": (80,),
    }


@pytest.mark.parametrize(
    ("flow_class", "config", "expected"),
    [
        (CosyVoice2Flow, CosyVoice2FlowConfig(), official_v2_keys()),
        (CosyVoice3Flow, CosyVoice3FlowConfig(), official_v3_keys()),
    ],
)
def test_full_size_parameters_carry_the_official_names_and_shapes(flow_class, config, expected):
    with torch.device("meta"):
        full = flow_class(config, TinyEstimator(80, 50))
    state = full.state_dict()
    assert all(name.startswith("decoder.estimator.") for name in state if name not in expected)
    ours = {name: tuple(value.shape) for name, value in state.items() if not name.startswith("decoder.estimator.")}
    assert ours == expected


def test_the_solver_noise_is_upstreams_seeded_table_and_leaves_the_global_generator_alone():
    estimator = TinyEstimator(MEL, 2 * CHUNK)
    before = torch.get_rng_state()
    solver = ConditionalFlowMatching(estimator, mel_bins=80)
    assert torch.equal(torch.get_rng_state(), before)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        expected = torch.randn(1, 80, NOISE_FRAMES)
    assert torch.equal(solver.noise, expected)
    assert "noise" not in solver.state_dict()


def test_the_solver_is_deterministic_and_draws_no_random_numbers():
    torch.manual_seed(0)
    solver = ConditionalFlowMatching(TinyEstimator(MEL, 2 * CHUNK), mel_bins=MEL).eval()
    generator = torch.Generator().manual_seed(1)
    mu, cond = torch.randn(2, MEL, 12, generator=generator), torch.randn(2, MEL, 12, generator=generator)
    spks, mask = torch.randn(2, MEL, generator=generator), torch.ones(2, 1, 12)
    before = torch.get_rng_state()
    first = solver(mu, mask, spks, cond, streaming=True)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(solver(mu, mask, spks, cond, streaming=True), first)


class RecordingEstimator(nn.Module):
    """Returns a fixed velocity per half of the batch (conditioned rows, then unconditioned) and keeps its inputs."""

    def __init__(self, conditioned: float, free: float):
        super().__init__()
        self.conditioned, self.free = conditioned, free
        self.calls: list[dict[str, torch.Tensor]] = []

    def forward(self, x, mask, mu, t, spks, cond, streaming: bool):
        self.calls.append({"x": x, "mask": mask, "mu": mu, "t": t, "spks": spks, "cond": cond, "streaming": streaming})
        half = x.size(0) // 2
        return torch.cat([torch.full_like(x[:half], self.conditioned), torch.full_like(x[half:], self.free)])


def test_the_solver_takes_cosine_euler_steps_with_classifier_free_guidance():
    estimator = RecordingEstimator(conditioned=2.0, free=-1.0)
    solver = ConditionalFlowMatching(estimator, CFMParams(inference_cfg_rate=0.7, n_timesteps=10), mel_bins=MEL)
    generator = torch.Generator().manual_seed(2)
    mu, cond = torch.randn(3, MEL, 6, generator=generator), torch.randn(3, MEL, 6, generator=generator)
    spks, mask = torch.randn(3, MEL, generator=generator), torch.ones(3, 1, 6)
    mel = solver(mu, mask, spks, cond, streaming=False)
    # t runs 0 to 1, so the constant guided velocity 1.7·2 + 0.7·1 moves the noise by exactly that much.
    torch.testing.assert_close(mel, solver.noise[:, :, :6].expand(3, -1, -1) + 4.1)
    times = torch.stack([call["t"][0] for call in estimator.calls])
    torch.testing.assert_close(times, 1 - torch.cos(torch.arange(10) / 10 * math.pi / 2))
    first = estimator.calls[0]
    assert torch.equal(first["x"][:3], first["x"][3:]) and torch.equal(first["mask"], torch.ones(6, 1, 6))
    assert torch.equal(first["mu"][:3], mu) and not first["mu"][3:].any()
    assert torch.equal(first["spks"][:3], spks) and not first["spks"][3:].any()
    assert torch.equal(first["cond"][:3], cond) and not first["cond"][3:].any()
    assert all(call["streaming"] is False for call in estimator.calls)


def test_the_prompt_mel_must_be_twice_the_prompt_tokens(flow):
    inputs = batch([random_request(4, 8, seed=9)])
    inputs["prompt_mel_lengths"] = inputs["prompt_mel_lengths"] - 1
    with pytest.raises(ValueError, match="match_prompt_lengths"):
        flow.inference(**inputs, streaming=False, finalize=True)


def test_a_streaming_call_needs_its_lookahead_tokens(flow):
    with pytest.raises(ValueError, match="at least 3 tokens per row"):
        run(flow, [random_request(4, 2, seed=10)], streaming=True, finalize=False)


def test_match_prompt_lengths_trims_to_what_both_cover():
    tokens, mel = torch.arange(10), torch.randn(23, MEL)
    trimmed_tokens, trimmed_mel = match_prompt_lengths(tokens, mel)
    assert torch.equal(trimmed_tokens, tokens) and torch.equal(trimmed_mel, mel[:20])
    trimmed_tokens, trimmed_mel = match_prompt_lengths(tokens, mel[:15])
    assert torch.equal(trimmed_tokens, tokens[:7]) and torch.equal(trimmed_mel, mel[:14])


def test_streaming_masks_are_block_causal_over_valid_keys():
    mask = attention_mask(torch.tensor([5, 3]), 5, chunk_size=2)
    # Row 0: query i sees keys j < (i // 2 + 1) · 2; row 1 also only its 3 valid keys.
    expected0 = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert torch.equal(mask[0], expected0.bool())
    assert torch.equal(mask[1], expected0.bool() & torch.tensor([1, 1, 1, 0, 0]).bool())
    assert torch.equal(
        attention_mask(torch.tensor([5, 3]), 5, None)[:, 0], torch.tensor([[1] * 5, [1, 1, 1, 0, 0]]).bool()
    )


def test_relative_position_attention_follows_its_formula():
    torch.manual_seed(3)
    size, heads, length = 8, 2, 5
    attention = RelPositionMultiHeadedAttention(heads, size)
    xs = torch.randn(1, length, size)
    mask = torch.ones(1, length, length, dtype=torch.bool).tril()
    table = relative_position_table(length, size, xs.device, xs.dtype)
    got = attention(xs, mask, table)

    def encoding(distance: int) -> torch.Tensor:
        frequencies = 10000.0 ** (-torch.arange(0, size, 2) / size)
        return torch.stack([torch.sin(distance * frequencies), torch.cos(distance * frequencies)], -1).flatten()

    def split(values: torch.Tensor) -> torch.Tensor:
        return values.view(heads, size // heads)

    q, k, v = (layer(xs[0]) for layer in (attention.linear_q, attention.linear_k, attention.linear_v))
    scores = torch.empty(heads, length, length)
    for i in range(length):
        for j in range(length):
            position = split(attention.linear_pos(encoding(i - j)))
            scores[:, i, j] = ((split(q[i]) + attention.pos_bias_u) * split(k[j])).sum(-1) + (
                (split(q[i]) + attention.pos_bias_v) * position
            ).sum(-1)
    weights = (scores / math.sqrt(size // heads)).masked_fill(~mask, -float("inf")).softmax(-1)
    heads_out = torch.einsum("hij,jhd->ihd", weights, v.view(length, heads, size // heads))
    expected = attention.linear_out(heads_out.reshape(length, size))
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-5)
