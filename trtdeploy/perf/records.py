"""One request of a run: its times, raw responses while it runs, and what the workload read from them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .workload import Request, Result


class Record:
    """One request. While it runs: send time, each response with its arrival time, end time, error.

    Once complete, :meth:`LevelRunner.decode <trtdeploy.perf.loadgen.LevelRunner>` replaces the raw responses by
    what the workload read from them (:meth:`set_result`). Times are ``time.perf_counter_ns()``; ``chunk_ns`` then
    holds only the chunks with content.
    """

    __slots__ = (
        "seq",
        "row",
        "warmup",
        "send_ns",
        "end_ns",
        "chunk_ns",
        "raw",
        "error",
        "unanswered",
        "scheduled_ns",
        "level",
        "worker",
        "chunk_tokens",
        "chunk_audio",
        "input_tokens",
        "input_characters",
        "output_tokens",
        "first_chunk_tokens",
        "token_source",
        "text",
        "reference",
        "audio_seconds",
        "audio",
        "sample_rate",
        "label",
        "scores",
        "accuracy",
    )

    def __init__(self, seq: int, row: int, warmup: bool) -> None:
        self.seq = seq
        self.row = row
        self.warmup = warmup
        self.send_ns = 0
        self.end_ns = 0
        self.chunk_ns: list[int] = []
        self.raw: list[Any] | None = []
        self.error: str | None = None
        #: Failed without an answer from the server (the connection broke or was refused, or it timed out), as
        #: opposed to an error the server answered with.
        self.unanswered = False
        #: Open loop: when the request was due (its send time minus this is the client's scheduling lag).
        self.scheduled_ns: int | None = None

    def fail(self, message: str, now_ns: int) -> None:
        """End the request as failed without an answer: ``message`` says why (the first error wins). A request given
        up before it was sent counts as sent and failed at once."""
        if not self.send_ns:
            self.send_ns = now_ns
        if not self.end_ns:
            self.end_ns = now_ns
        if self.error is None:
            self.error = message
            self.unanswered = True

    def set_result(self, level: int, worker: int, request: Request, result: Result, chunks: Sequence[Any]) -> None:
        self.level = level
        self.worker = worker
        self.input_tokens = result.input_tokens if result.input_tokens is not None else request.input_tokens
        self.input_characters = request.input_characters
        self.reference = request.reference
        self.chunk_tokens = [chunk.tokens for chunk in chunks]
        self.chunk_audio = [chunk.audio_seconds for chunk in chunks]
        self.output_tokens = result.output_tokens
        self.first_chunk_tokens = result.first_chunk_tokens
        self.token_source = result.token_source
        self.text = result.text
        self.audio_seconds = result.audio_seconds
        self.audio = result.audio
        self.sample_rate = result.sample_rate
        self.label = request.label
        self.scores = dict(result.scores)
        self.accuracy = result.accuracy
        self.raw = None
