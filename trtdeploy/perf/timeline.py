"""Where a request's time went, from Triton's own trace (``--trace-config``, level TIMESTAMPS): the models it
called (BLS calls that pass on their caller's ``request.trace()``, and ensemble steps), how long each waited in its
queue and ran, and what happened before the first response went out (a stream's first chunk).

:func:`read_traces` reads the trace files Triton wrote; :func:`timelines` builds one :class:`Timeline` per request
the clients sent (a trace with no parent); :func:`summarize` gives the medians over a set of them. Timestamps are
Triton's steady clock (``CLOCK_MONOTONIC`` on Linux, as :func:`time.monotonic_ns`), so a caller on the same machine
can pick the requests of a time window.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Timestamps marking a response on its way out, earliest first in preference.
_RESPONSE_MARKS = ("GRPC_SEND_START", "HTTP_SEND_START", "INFER_RESPONSE_COMPLETE")


@dataclass
class _Trace:
    id: int
    model: str = ""
    parent: int | None = None
    marks: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def first(self, name: str) -> int | None:
        found = self.marks.get(name)
        return min(found) if found else None


@dataclass(frozen=True)
class Call:
    """One call a request made (or one of its calls made in turn: ``depth`` > 1), times in ns."""

    model: str
    depth: int
    start: int
    end: int
    queue_ns: int


@dataclass(frozen=True)
class Timeline:
    """One client request: its model, when it started and ended, when its first response went out, and its calls."""

    model: str
    start: int
    end: int
    first_response: int
    calls: tuple[Call, ...]

    def rest_ns(self, until: int | None = None) -> int:
        """Time up to ``until`` (default: the end) in which none of its direct calls was running: the calling
        model's own work, and its waits on answers sent after the called model's ``execute`` returned (Triton ends a
        call's trace there: an LLM engine's decode loop answers later)."""
        stop = self.end if until is None else until
        busy, reach = 0, self.start
        for call in sorted((c for c in self.calls if c.depth == 1), key=lambda c: c.start):
            begin, finish = max(call.start, reach), min(call.end, stop)
            if finish > begin:
                busy += finish - begin
                reach = finish
        return max(stop - self.start - busy, 0)


def read_traces(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The entries of Triton's trace files (each a JSON array; a file cut short by a crash is read up to its last
    whole entry)."""
    decoder = json.JSONDecoder()
    entries: list[dict[str, Any]] = []
    for path in paths:
        text = Path(path).read_text()
        position = text.find("[") + 1
        while position:
            while position < len(text) and text[position] in " \t\r\n,":
                position += 1
            try:
                entry, position = decoder.raw_decode(text, position)
            except json.JSONDecodeError:  # the array's end, or an entry cut short
                break
            entries.append(entry)
    return entries


def timelines(entries: Sequence[dict[str, Any]]) -> list[Timeline]:
    """One timeline per request with no parent trace that started, ended and has every mark it needs, by start."""
    traces: dict[int, _Trace] = {}
    for entry in entries:
        trace = traces.setdefault(entry["id"], _Trace(entry["id"]))
        if "model_name" in entry:
            trace.model = entry["model_name"]
            trace.parent = entry.get("parent_id")
        for mark in entry.get("timestamps", ()):
            trace.marks[mark["name"]].append(int(mark["ns"]))
    children: dict[int, list[_Trace]] = defaultdict(list)
    for trace in traces.values():
        if trace.parent is not None:
            children[trace.parent].append(trace)
    found = []
    for root in traces.values():
        start, end = root.first("REQUEST_START"), root.first("REQUEST_END")
        if root.parent is not None or start is None or end is None:
            continue
        first = next((mark for mark in map(root.first, _RESPONSE_MARKS) if mark is not None), end)
        calls = tuple(sorted(_calls(root.id, children, 1), key=lambda call: call.start))
        found.append(Timeline(root.model, start, end, min(first, end), calls))
    return sorted(found, key=lambda timeline: timeline.start)


def _calls(parent: int, children: dict[int, list[_Trace]], depth: int) -> Iterable[Call]:
    for child in children.get(parent, ()):
        start, end = child.first("REQUEST_START"), child.first("REQUEST_END")
        if start is None or end is None:
            continue
        queued, computing = child.first("QUEUE_START"), child.first("COMPUTE_START")
        queue = computing - queued if queued is not None and computing is not None else 0
        yield Call(child.model, depth, start, end, queue)
        yield from _calls(child.id, children, depth + 1)


def summarize(found: Sequence[Timeline]) -> dict[str, Any]:
    """Medians over the timelines (ms): the latency, the first response, and per model called directly its calls,
    time, queueing and time before the first response; ``rest`` is :meth:`Timeline.rest_ns`."""
    if not found:
        return {"requests": 0, "models": {}}
    per_model: dict[str, list[tuple[int, float, float, float]]] = defaultdict(list)
    for timeline in found:
        totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for call in timeline.calls:
            if call.depth != 1:
                continue
            row = totals[call.model]
            row[0] += 1
            row[1] += call.end - call.start
            row[2] += call.queue_ns
            row[3] += max(min(call.end, timeline.first_response) - call.start, 0)
        for model, (count, total, queue, before) in totals.items():
            per_model[model].append((count, total, queue, before))
    requests = len(found)

    def median(values: Iterable[float]) -> float:
        values = list(values)
        return statistics.median(values + [0.0] * (requests - len(values)))  # requests that made no such call

    def median_ms(values: Iterable[float]) -> float:
        return median(values) / 1e6

    return {
        "requests": requests,
        "latency_ms": median_ms(t.end - t.start for t in found),
        "first_response_ms": median_ms(t.first_response - t.start for t in found),
        "rest_ms": median_ms(t.rest_ns() for t in found),
        "rest_before_first_ms": median_ms(t.rest_ns(t.first_response) for t in found),
        "models": {
            model: {
                "calls": median(row[0] for row in rows),
                "ms": median_ms(row[1] for row in rows),
                "queue_ms": median_ms(row[2] for row in rows),
                "before_first_ms": median_ms(row[3] for row in rows),
            }
            for model, rows in sorted(per_model.items())
        },
    }
