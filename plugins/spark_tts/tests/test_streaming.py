"""The streaming chunk schedule and server-side cross-fade, against a vocoder with a known receptive radius."""

from __future__ import annotations

import numpy as np
import pytest
from trtdeploy_spark_tts.prompt import SAMPLES_PER_TOKEN
from trtdeploy_spark_tts.streaming import AudioStream, ChunkSchedule, OverlappedChunks, crossfade

from trtdeploy.perf.tts import join_overlapped

RADIUS = 3  # tokens on each side that change a token's audio in the vocoder below


def smoothing_vocoder(codes: np.ndarray) -> np.ndarray:
    """A convolutional 'vocoder': each token's samples depend on the tokens within RADIUS of it (zero-padded)."""
    values = np.sin(np.asarray(codes, dtype=np.float64) * 0.37)
    padded = np.pad(values, RADIUS)
    smooth = np.convolve(padded, np.arange(1, 2 * RADIUS + 2, dtype=np.float64), mode="valid")
    ramp = np.linspace(0.5, 1.0, SAMPLES_PER_TOKEN)
    return (np.repeat(smooth, SAMPLES_PER_TOKEN) * np.tile(ramp, len(codes))).astype(np.float32)


def stream(codes: np.ndarray, schedule: ChunkSchedule, step: int = 1) -> tuple[list[np.ndarray], list[int]]:
    """Push ``codes`` ``step`` at a time; returns the chunks and the vocoder window sizes used."""
    windows: list[int] = []

    def vocode(window: np.ndarray) -> np.ndarray:
        windows.append(window.size)
        return smoothing_vocoder(window)

    audio_stream = AudioStream(schedule, vocode)
    chunks = [chunk for i in range(0, codes.size, step) for chunk in audio_stream.push(codes[i : i + step])]
    rest = audio_stream.finish()
    return chunks + ([rest] if rest is not None else []), windows


@pytest.mark.parametrize("step", [1, 7, 64])
def test_streamed_audio_has_the_offline_length_and_matches_it_away_from_the_seams(step: int) -> None:
    codes = np.random.default_rng(0).integers(0, 8192, 700)
    schedule = ChunkSchedule(first_tokens=50, growth=4.0, max_tokens=300, overlap_tokens=5, context_tokens=RADIUS)
    chunks, _ = stream(codes, schedule, step)
    offline = smoothing_vocoder(codes)
    joined = np.concatenate(chunks)
    assert joined.size == offline.size == codes.size * SAMPLES_PER_TOKEN
    assert len(chunks) >= 3
    # every token farther than RADIUS + overlap from a vocoded window's right edge is exactly the offline audio
    ends = np.cumsum([chunk.size for chunk in chunks]) // SAMPLES_PER_TOKEN
    exact = np.ones(codes.size, dtype=bool)
    for end in ends[:-1]:
        exact[max(0, end - RADIUS) : end + schedule.overlap_tokens + RADIUS] = False
    per_token = np.abs(joined - offline).reshape(codes.size, SAMPLES_PER_TOKEN).max(axis=1)
    assert per_token[exact].max() < 1e-5
    assert exact.mean() > 0.8


def test_chunks_follow_the_schedule_in_tokens() -> None:
    codes = np.arange(1000) % 8192
    schedule = ChunkSchedule(first_tokens=50, growth=8.0, max_tokens=1500, overlap_tokens=5, context_tokens=10)
    chunks, windows = stream(codes, schedule, step=3)
    sizes = [chunk.size // SAMPLES_PER_TOKEN for chunk in chunks]
    # 50 tokens (5 held back for the cross-fade), then 400 more, then the rest at the end
    assert sizes == [45, 400, 555]
    # each later window re-reads the context before the audio it sends
    assert windows == [50, 400 + 5 + 10, 1000 - 450 + 5 + 10]


def test_a_short_answer_is_sent_whole_at_the_end() -> None:
    chunks, windows = stream(np.arange(20), ChunkSchedule(first_tokens=50, context_tokens=4))
    assert [chunk.size for chunk in chunks] == [20 * SAMPLES_PER_TOKEN]
    assert windows == [20]


def test_nothing_in_nothing_out() -> None:
    audio_stream = AudioStream(ChunkSchedule(), smoothing_vocoder)
    assert audio_stream.push([]) == []
    assert audio_stream.finish() is None


def test_crossfade_moves_from_old_to_new() -> None:
    faded = crossfade(np.ones(100, dtype=np.float32), np.zeros(100, dtype=np.float32))
    assert faded[0] > 0.99 and faded[-1] < 0.01
    assert np.all(np.diff(faded) < 0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"first_tokens": 0},
        {"first_tokens": 50, "max_tokens": 10},
        {"growth": 0.5},
        {"overlap_tokens": 50},
        {"first_tokens": 9, "overlap_tokens": 5},
    ],
)
def test_schedule_rejects_impossible_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ChunkSchedule(**kwargs)


def test_tokens_until_next_chunk_asks_for_exactly_one_chunk_at_a_time() -> None:
    """The BLS asks the LLM for this many tokens per call: each call then completes exactly one chunk."""
    schedule = ChunkSchedule(first_tokens=25, growth=4.0, max_tokens=400, overlap_tokens=5, context_tokens=RADIUS)
    audio_stream = AudioStream(schedule, smoothing_vocoder)
    asked = []
    for _ in range(5):
        wanted = audio_stream.tokens_until_next_chunk()
        asked.append(wanted)
        assert len(audio_stream.push(np.arange(wanted) % 8192)) == 1
    assert asked == [25, 100, 400, 400, 400]
    audio_stream.push([1, 2, 3])
    assert audio_stream.tokens_until_next_chunk() == 397


@pytest.mark.parametrize(
    ("tokens", "step"),
    [(700, 1), (700, 64), (25 + 100 + 400, 25), (30, 7), (3, 1)],  # 525: the answer ends on a chunk boundary
)
def test_overlapped_chunks_rebuild_by_the_official_rule_into_the_finished_audio(tokens: int, step: int) -> None:
    codes = np.random.default_rng(tokens).integers(0, 8192, tokens)
    schedule = ChunkSchedule(first_tokens=25, growth=4.0, max_tokens=400, overlap_tokens=5, context_tokens=RADIUS)
    finished, _ = stream(codes, schedule, step)
    overlap = schedule.overlap_tokens * SAMPLES_PER_TOKEN
    wire = OverlappedChunks(overlap)
    sent = [wire.wire(chunk) for chunk in finished]
    for previous, chunk in zip(sent, sent[1:], strict=False):
        assert np.array_equal(chunk[:overlap], previous[-overlap:])
        assert chunk.size >= 2 * overlap  # the official rule needs a whole overlap at each end
    rebuilt = join_overlapped(sent, overlap)
    assert rebuilt.size == tokens * SAMPLES_PER_TOKEN
    joined = np.concatenate(finished)
    assert np.abs(rebuilt - joined).max() <= 1e-6 * np.abs(joined).max()  # the fades' float rounding


@pytest.mark.parametrize("step", [1, 7, 64])
def test_a_lookahead_of_the_receptive_radius_streams_the_offline_audio_exactly(step: int) -> None:
    codes = np.random.default_rng(1).integers(0, 8192, 700)
    schedule = ChunkSchedule(
        first_tokens=25, growth=4.0, max_tokens=300, overlap_tokens=5, context_tokens=RADIUS, lookahead_tokens=RADIUS
    )
    chunks, _ = stream(codes, schedule, step)
    offline = smoothing_vocoder(codes)
    assert len(chunks) >= 3 and all(chunk.size >= 5 * SAMPLES_PER_TOKEN for chunk in chunks)
    assert np.abs(np.concatenate(chunks) - offline).max() <= 1e-6 * np.abs(offline).max()


def test_a_lookahead_must_leave_the_first_chunk_an_overlap() -> None:
    with pytest.raises(ValueError, match="a lookahead of 30 tokens needs a first chunk of at least 35 tokens"):
        ChunkSchedule(first_tokens=25, overlap_tokens=5, lookahead_tokens=30)
