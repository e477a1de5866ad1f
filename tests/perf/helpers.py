"""Hand-made records for metric and report tests (times in ms, converted to ns)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from trtdeploy.perf.loadgen import Level
from trtdeploy.perf.metrics import LevelStats
from trtdeploy.perf.records import Record
from trtdeploy.perf.slo import Slo
from trtdeploy.perf.workload import Chunk, Request, Result

MS = 1_000_000


def record(
    send: float,
    end: float,
    chunks: Sequence[tuple[float, int]] = (),
    *,
    seq: int = 0,
    warmup: bool = False,
    error: str | None = None,
    input_tokens: int | None = 10,
    text: str | None = None,
    reference: str | None = None,
    audio: Sequence[float] = (),
    characters: int | None = None,
    level: int = 0,
) -> Record:
    """A decoded record: sent at ``send`` ms, ended at ``end`` ms, with (arrival ms, tokens) chunks."""
    rec = Record(seq, seq, warmup)
    rec.send_ns, rec.end_ns = int(send * MS), int(end * MS)
    rec.error = error
    parsed = [Chunk(tokens=tokens, audio_seconds=audio[i] if audio else 0.0) for i, (_, tokens) in enumerate(chunks)]
    rec.chunk_ns = [int(at * MS) for at, _ in chunks]
    total = sum(tokens for _, tokens in chunks) if chunks and error is None else None
    result = Result(
        output_tokens=total,
        first_chunk_tokens=chunks[0][1] if chunks and error is None else None,
        token_source="server" if total is not None else None,
        text=text,
        audio_seconds=sum(audio) if audio else None,
    )
    request = Request(inputs={}, reference=reference, input_tokens=input_tokens, input_characters=characters)
    rec.set_result(level, 0, request, result, parsed)
    return rec


def level(concurrency: int = 2, num_requests: int = 2, warmup: int = 0, index: int = 0) -> Level:
    return Level(index, rows=tuple(range(num_requests)), warmup_rows=tuple(range(warmup)), concurrency=concurrency)


def summarize_level(
    records: Iterable[Record],
    level: Level,
    *,
    stream: bool,
    family: str,
    slo: str = "",
    client_cpu_s: Sequence[float] = (),
) -> dict[str, Any]:
    """The summary of a level from all its records, as the engine builds it one record at a time (``slo`` as
    ``--slo`` takes it)."""
    stats = LevelStats(level, stream=stream, family=family, slo=Slo.parse(slo) if slo else None)
    for rec in records:
        stats.add(rec, stats.metrics(rec))
    return stats.summary(client_cpu_s)
