"""The load: closed-loop concurrency levels and open-loop (Poisson) request rates, in one or more processes.

Closed loop: each of N slots sends its next request as soon as its last one is complete (one shared queue of
requests per process, so no slot idles while another has work left). Open loop: requests are sent at Poisson
arrival times whatever is in flight. The first ``warmup`` requests of a level are sent the same way but excluded
from the metrics. With ``workers`` > 1 the slots (or the rate) are split across spawned processes, each with its own
connection, and their records are merged; ``time.perf_counter_ns`` is the system-wide monotonic clock on Linux,
so times from different processes compare.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from ..errors import TrtDeployError
from .transports import Caller, Protocol, Transport, make_transport
from .workload import Request, Result, Workload

#: Seconds between progress reports.
PROGRESS_INTERVAL = 0.2
#: Called with (requests complete, requests failed) of the running level.
ProgressCallback = Callable[[int, int], None]


class Record:
    """One request. While it runs: send time, each response with its arrival time, end time, error.

    After its level, :meth:`LevelRunner.decode` replaces the raw responses by what the workload read from them.
    Times are ``time.perf_counter_ns()``; ``chunk_ns`` then holds only the chunks with content.
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
        "scheduled_ns",
        "level",
        "worker",
        "chunk_tokens",
        "chunk_audio",
        "input_tokens",
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
        #: Open loop: when the request was due (its send time minus this is the client's scheduling lag).
        self.scheduled_ns: int | None = None

    def set_result(self, level: int, worker: int, request: Request, result: Result, chunks: Sequence[Any]) -> None:
        self.level = level
        self.worker = worker
        self.input_tokens = request.input_tokens
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
        self.raw = None


Item = tuple[int, int, bool]  # (sequence number in the level, input row, warmup)


@dataclass
class PhaseResult:
    """The records of one phase of a level, and the CPU seconds each client process spent sending them."""

    records: list[Record]
    cpu_s: list[float]


@dataclass(frozen=True)
class Share:
    """What one process sends during a level."""

    items: list[Item]
    slots: int = 0  # closed loop
    rate: float | None = None  # open loop, requests/s
    seed: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class Level:
    """One load level: ``concurrency`` slots (closed loop) or ``request_rate`` requests/s (open loop)."""

    index: int
    num_requests: int
    warmup: int
    concurrency: int | None = None
    request_rate: float | None = None
    #: The input row of the level's first measured request.
    row_offset: int = 0

    @property
    def label(self) -> str:
        if self.request_rate is not None:
            return f"rate {self.request_rate:g}/s"
        return f"concurrency {self.concurrency}"

    def items(self, rows: int, *, warmup: bool) -> list[Item]:
        """The warmup or the measured requests. Measured requests walk the rows from ``row_offset``, wrapping
        around; warmup requests take the rows after them (so they warm no cache for the measured prompts)."""
        if warmup:
            first = self.row_offset + self.num_requests
            return [(seq, (first + seq) % rows, True) for seq in range(self.warmup)]
        return [(self.warmup + j, (self.row_offset + j) % rows, False) for j in range(self.num_requests)]

    def shares(self, rows: int, workers: int, seed: int, *, warmup: bool) -> list[Share]:
        """Split a phase across ``workers`` processes: slots round-robin, requests in proportion to slots."""
        items = self.items(rows, warmup=warmup)
        seeds = [(seed, self.index, w, int(warmup)) for w in range(workers)]
        if self.request_rate is not None:
            return [Share(items[w::workers], rate=self.request_rate / workers, seed=seeds[w]) for w in range(workers)]
        assert self.concurrency is not None
        owners = [slot % workers for slot in range(self.concurrency)]
        per_worker: list[list[Item]] = [[] for _ in range(workers)]
        for position, item in enumerate(items):
            per_worker[owners[position % self.concurrency]].append(item)
        return [Share(per_worker[w], slots=owners.count(w), seed=seeds[w]) for w in range(workers)]


class LevelRunner:
    """Sends the requests of a process's share of each level over one transport, then decodes the responses."""

    def __init__(
        self, transport: Transport, workload: Workload, requests: Sequence[Request], *, stream: bool, worker: int = 0
    ) -> None:
        self.transport = transport
        self.workload = workload
        self.requests = requests
        self.stream = stream
        self.worker = worker
        self.payloads: list[Any] = []
        #: Progress of the running level.
        self.done = 0
        self.errors = 0
        #: CPU seconds this process spent in the last :meth:`run` (all its threads: grpc's included).
        self.cpu_s = 0.0

    async def open(self, slots: int) -> None:
        await self.transport.open(slots)
        self.payloads = [self.transport.encode(request, stream=self.stream) for request in self.requests]

    async def close(self) -> None:
        await self.transport.close()

    async def run(self, share: Share) -> list[Record]:
        self.done = self.errors = 0
        records: list[Record] = []
        cpu = time.process_time()
        try:
            if share.rate is None:
                items = iter(share.items)
                callers = [self.transport.caller(stream=self.stream) for _ in range(share.slots)]  # a stream per slot
                await asyncio.gather(*(self._slot(items, call, records) for call in callers))
            elif share.items:
                await self._open_loop(share, records)
        finally:
            await self.transport.release()
        self.cpu_s = time.process_time() - cpu
        return records

    async def _slot(self, items: Iterator[Item], call: Caller, records: list[Record]) -> None:
        payloads = self.payloads
        for seq, row, warmup in items:
            rec = Record(seq, row, warmup)
            await call(payloads[row], rec)
            records.append(rec)
            self.done += 1
            if rec.error is not None:
                self.errors += 1

    async def _one(self, call: Caller, rec: Record, records: list[Record]) -> None:
        await call(self.payloads[rec.row], rec)
        records.append(rec)
        self.done += 1
        if rec.error is not None:
            self.errors += 1

    async def _open_loop(self, share: Share, records: list[Record]) -> None:
        import numpy as np

        assert share.rate is not None
        call = self.transport.caller(stream=self.stream)  # one stream for all
        gaps = np.random.default_rng(list(share.seed)).exponential(1e9 / share.rate, len(share.items))
        offsets = np.cumsum(gaps).astype(np.int64).tolist()
        tasks: set[asyncio.Future[None]] = set()
        start = time.perf_counter_ns()
        for (seq, row, warmup), offset in zip(share.items, offsets, strict=True):
            due = start + offset
            delay = due - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            rec = Record(seq, row, warmup)
            rec.scheduled_ns = due
            task = asyncio.ensure_future(self._one(call, rec, records))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    def decode(self, records: list[Record], level: int) -> None:
        """Read every kept response through the workload; an unreadable one fails its request.

        Audio is kept for the first measured request of each input row (what the reports save), not for others.
        """
        workload, decode = self.workload, self.transport.decode
        audio_rows: set[int] = set()
        for rec in records:
            request = self.requests[rec.row]
            chunks: list[Any] = []
            times: list[int] = []
            result = Result()
            if rec.error is None:
                try:
                    for arrived, raw in zip(rec.chunk_ns, rec.raw or (), strict=True):
                        chunk = workload.parse_chunk(decode(raw), request)
                        if chunk.has_content:
                            chunks.append(chunk)
                            times.append(arrived)
                    result = workload.finish(request, chunks)
                except Exception as exc:  # a response the workload cannot read is a failed request, not a crash
                    rec.error = f"unreadable response: {type(exc).__name__}: {exc}"
                    chunks, times, result = [], [], Result()
            rec.chunk_ns = times
            rec.set_result(level, self.worker, request, result, chunks)
            if rec.audio is not None and (rec.warmup or rec.row in audio_rows):
                rec.audio = None
            elif rec.audio is not None:
                audio_rows.add(rec.row)


# --- worker processes ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    """What a process needs to build its own transport: where, which model, how, and how many slots at most."""

    protocol: Protocol
    url: str
    model_name: str
    timeout_s: float
    stream: bool
    slots: int

    def runner(self, workload: Workload, requests: Sequence[Request], worker: int = 0) -> LevelRunner:
        transport = make_transport(self.protocol, self.url, self.model_name, timeout_s=self.timeout_s)
        return LevelRunner(transport, workload, requests, stream=self.stream, worker=worker)


class LocalDriver:
    """Runs the load in this process (``--workers 1``), reporting progress every PROGRESS_INTERVAL seconds."""

    def __init__(self, spec: WorkerSpec, workload: Workload, requests: Sequence[Request]) -> None:
        self._spec = spec
        self._runner = spec.runner(workload, requests)

    async def start(self) -> None:
        await self._runner.open(self._spec.slots)

    async def run_phase(
        self, level: Level, rows: int, seed: int, progress: ProgressCallback, *, warmup: bool
    ) -> PhaseResult:
        """Run one phase (warmup or measured) of a level."""
        runner = self._runner
        (share,) = level.shares(rows, 1, seed, warmup=warmup)

        async def tick() -> None:
            while True:
                await asyncio.sleep(PROGRESS_INTERVAL)
                progress(runner.done, runner.errors)

        ticker = asyncio.ensure_future(tick())
        try:
            records = await runner.run(share)
        finally:
            ticker.cancel()
        progress(runner.done, runner.errors)
        runner.decode(records, level.index)
        return PhaseResult(records, [runner.cpu_s])

    async def close(self) -> None:
        await self._runner.close()


def _worker_main(conn: Connection, index: int, spec: WorkerSpec, workload: Workload, requests: list[Request]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the workers
    try:
        asyncio.run(_worker_loop(conn, index, spec, workload, requests))
    except Exception as exc:
        message = exc.message if isinstance(exc, TrtDeployError) else traceback.format_exc()
        conn.send(("error", message))
    finally:
        conn.close()


async def _worker_loop(
    conn: Connection, index: int, spec: WorkerSpec, workload: Workload, requests: list[Request]
) -> None:
    runner = spec.runner(workload, requests, index)
    await runner.open(spec.slots)
    conn.send(("ready", None))
    try:
        while True:
            command, *args = conn.recv()  # blocking is fine: nothing else runs in this process between levels
            if command == "stop":
                return
            level, share = args
            conn.send(("armed", None))
            if conn.recv()[0] != "go":  # the parent gave up on this level ("stop")
                return

            async def tick() -> None:
                while True:
                    await asyncio.sleep(PROGRESS_INTERVAL)
                    conn.send(("progress", (runner.done, runner.errors)))

            ticker = asyncio.ensure_future(tick())
            try:
                records = await runner.run(share)
            finally:
                ticker.cancel()
            runner.decode(records, level)
            conn.send(("done", PhaseResult(records, [runner.cpu_s])))
    finally:
        await runner.close()


class WorkerPool:
    """``workers`` spawned processes, each running a :class:`LevelRunner`; levels are started on all at once."""

    def __init__(self, spec: WorkerSpec, workload: Workload, requests: list[Request], workers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for index in range(workers):
            parent, child = context.Pipe()
            proc = context.Process(
                target=_worker_main, args=(child, index, spec, workload, requests), name=f"trtdeploy-perf-{index}"
            )
            proc.daemon = True
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        #: A phase is running: closing now (Ctrl-C, an error) terminates the workers instead of waiting.
        self._busy = False

    async def _receive(self, conns: list[Connection]) -> list[tuple[Connection, str, Any]]:
        ready = await asyncio.get_running_loop().run_in_executor(None, wait, conns, PROGRESS_INTERVAL)
        messages = []
        for conn in ready:
            try:
                kind, payload = conn.recv()  # type: ignore[union-attr]
            except EOFError:
                raise TrtDeployError("a perf worker process exited unexpectedly") from None
            if kind == "error":
                raise TrtDeployError(f"a perf worker failed: {payload}")
            messages.append((conn, kind, payload))
        return messages

    async def _gather(
        self, conns: list[Connection], expected: str, on_progress: Callable[..., None] | None = None
    ) -> dict[Connection, Any]:
        results: dict[Connection, Any] = {}
        while len(results) < len(conns):
            for conn, kind, payload in await self._receive([c for c in conns if c not in results]):
                if kind == expected:
                    results[conn] = payload
                elif kind == "progress" and on_progress is not None:
                    on_progress(conn, payload)
        return results

    async def start(self) -> None:
        await self._gather(self._conns, "ready")

    async def run_phase(
        self, level: Level, rows: int, seed: int, progress: ProgressCallback, *, warmup: bool
    ) -> PhaseResult:
        """Run one phase (warmup or measured) of a level on every worker that has requests in it."""
        self._busy = True
        shares = level.shares(rows, len(self._conns), seed, warmup=warmup)
        active = [conn for conn, share in zip(self._conns, shares, strict=True) if share.items]
        for conn, share in zip(self._conns, shares, strict=True):
            if share.items:
                conn.send(("run", level.index, share))
        await self._gather(active, "armed")
        for conn in active:
            conn.send(("go",))
        counts: dict[Connection, tuple[int, int]] = {}

        def on_progress(conn: Connection, payload: tuple[int, int]) -> None:
            counts[conn] = payload
            progress(sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values()))

        done = await self._gather(active, "done", on_progress)
        self._busy = False
        records = [rec for conn in active for rec in done[conn].records]
        progress(len(records), sum(rec.error is not None for rec in records))
        return PhaseResult(records, [cpu for conn in active for cpu in done[conn].cpu_s])

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._stop)

    def _stop(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(timeout=0 if self._busy else 10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
