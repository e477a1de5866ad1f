"""Trace replay: a jsonl of requests in the format of the public Mooncake traces, sent at their recorded times.

Each line is ``{"timestamp": MS, "input_length": TOKENS, "output_length": TOKENS, "hash_ids": [ID, ...]}``: the
arrival in ms (any origin: the replay counts from the first request), the prompt's and the answer's lengths, and
the ids of the prompt's blocks of ``block_size`` tokens (512 in the published traces; the last block may be
partial), where requests naming the same id share that block of prompt (and, ids being chained hashes, every block
before it). The replay makes each prompt of those blocks' words (:class:`~trtdeploy.perf.inputs.PromptLayout`), so
a prefix cache sees the sharing the trace recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from .inputs import OWN_BLOCK, TRACE_BLOCK, PromptLayout, json_object, numbered_lines

#: Tokens per block of ``hash_ids`` in the published Mooncake traces.
DEFAULT_BLOCK_SIZE = 512


@dataclass(frozen=True)
class TraceRequest:
    """One line of a trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def _count(data: dict, key: str, where: str, *, least: int) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise UsageError(f'{where}: "{key}" must be an integer >= {least}, got {value!r}')
    return value


def _request(data: dict, where: str) -> TraceRequest:
    timestamp = data.get("timestamp")
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool) or not 0 <= timestamp < math.inf:
        raise UsageError(f'{where}: "timestamp" must be a number of ms >= 0, got {timestamp!r}')
    hash_ids = data.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(
        isinstance(block, int) and not isinstance(block, bool) and block >= 0 for block in hash_ids
    ):
        raise UsageError(f'{where}: "hash_ids" must be a list of integers >= 0, got {hash_ids!r}')
    return TraceRequest(
        timestamp_ms=float(timestamp),
        input_length=_count(data, "input_length", where, least=1),
        output_length=_count(data, "output_length", where, least=0),
        hash_ids=tuple(hash_ids),
    )


@dataclass(frozen=True)
class Trace:
    """The requests of a trace file, in its order (timestamps never decrease), replayed ``speedup`` times faster."""

    path: Path
    requests: tuple[TraceRequest, ...]
    speedup: float = 1.0
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        if not 0 < self.speedup < math.inf:
            raise UsageError(f"--trace-speedup must be > 0, got {self.speedup:g}", hint="e.g. 2 (twice as fast)")
        if self.block_size < 1:
            raise UsageError(f"--trace-block-size must be >= 1, got {self.block_size}")

    @classmethod
    def load(cls, path: Path, *, speedup: float = 1.0, block_size: int | None = None) -> Trace:
        """Read ``path`` (blocks of ``block_size`` tokens, default DEFAULT_BLOCK_SIZE); a line that is not a request
        of the format, or that goes back in time, is a UsageError naming ``file:line``."""
        requests: list[TraceRequest] = []
        for where, line in numbered_lines(path):
            request = _request(json_object(line, where), where)
            if requests and request.timestamp_ms < requests[-1].timestamp_ms:
                raise UsageError(
                    f"{where}: timestamp {request.timestamp_ms:g} is before the previous request's "
                    f"({requests[-1].timestamp_ms:g})",
                    hint="sort the trace by timestamp",
                )
            requests.append(request)
        if not requests:
            raise UsageError(f"trace {path} has no requests")
        return cls(path, tuple(requests), speedup, DEFAULT_BLOCK_SIZE if block_size is None else block_size)

    def schedule_ns(self) -> tuple[int, ...]:
        """When each request is due, in ns after the first, at the speed-up."""
        first = self.requests[0].timestamp_ms
        return tuple(round((request.timestamp_ms - first) * 1e6 / self.speedup) for request in self.requests)

    def clipped(self, caps: tuple[int, int]) -> tuple[int, int]:
        """How many requests are longer than the deployment's (max_input_len, max_output_len): prompts, answers."""
        return (
            sum(request.input_length > caps[0] for request in self.requests),
            sum(request.output_length > caps[1] for request in self.requests),
        )

    def layouts(self, start: int, count: int, caps: tuple[float, float]) -> list[PromptLayout]:
        """The prompts of requests ``start .. start + count - 1``: their blocks (the ids that the input length
        reaches; past the last, the request's own words), lengths clipped to ``caps`` (max_input_len,
        max_output_len) and answers of at least one token."""
        layouts = []
        for index, request in enumerate(self.requests[start : start + count], start=start):
            length = int(min(request.input_length, caps[0]))
            blocks = [((TRACE_BLOCK, block), self.block_size) for block in request.hash_ids]
            blocks = blocks[: math.ceil(length / self.block_size)]
            covered = len(blocks) * self.block_size
            if covered < length:
                blocks.append(((OWN_BLOCK, index), length - covered))
            max_tokens = int(min(max(request.output_length, 1), caps[1]))
            layouts.append(PromptLayout(tuple(blocks), length, max_tokens))
        return layouts

    def describe(self, caps: tuple[int, int] | None) -> str:
        """``trace.jsonl: 100 requests over 60 s, replayed 2x faster, 512-token blocks`` and how many were clipped."""
        span_s = (self.requests[-1].timestamp_ms - self.requests[0].timestamp_ms) / 1000
        text = f"trace {self.path}: {len(self.requests)} requests over {span_s:g} s"
        text += f", replayed {self.speedup:g}x faster" if self.speedup != 1 else ""
        text += f", {self.block_size}-token blocks"
        if caps is not None and any(self.clipped(caps)):
            prompts, answers = self.clipped(caps)
            text += f"; clipped: {prompts} prompts to max_input_len {caps[0]}, "
            text += f"{answers} answers to max_output_len {caps[1]}"
        return text
