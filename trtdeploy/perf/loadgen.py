"""The load: closed-loop concurrency levels and open-loop request rates, in one or more processes.

Closed loop: each of N slots sends its next request as soon as its last one is complete (one shared queue of
requests per process, so no slot idles while another has work left). Open loop: requests are sent at the times of
an arrival process (Poisson, gamma with a burstiness, or constant gaps; :data:`ARRIVALS`) whatever is in flight.
A level can run for a duration instead of sending its requests once: closed loop, the slots go round them until
the deadline; open loop, they are the arrivals due before it. The warmup requests of a level are sent the same
way (always once) but excluded from the metrics. With ``workers`` > 1 the slots (or the requests of the one
arrival process, with their times) are split across spawned processes, each with its own connection, and their
records are merged; ``time.perf_counter_ns`` is the system-wide monotonic clock on Linux, so times from different
processes compare.

A complete request is decoded through the workload after the next request of its slot has gone out, and handed to
a sink at once: nothing keeps raw responses beyond their request, so the client's memory stays flat however long
the run. A level can be given up (:meth:`LevelRunner.abort`): no new request goes out, the ones in flight fail with
the reason, and every record still reaches the sink.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection, wait
from typing import Any

from ..errors import TrtDeployError
from .control import Protocol, short, within
from .records import Record
from .transports import Caller, GrpcTransport, HttpTransport, Transport
from .workload import Request, Result, Workload

#: Seconds between progress reports (and, from worker processes, batches of records).
PROGRESS_INTERVAL = 0.2
#: A slot's pause after a request the server did not answer, doubling with each one in a row up to the maximum.
BACKOFF_S = 0.05
BACKOFF_MAX_S = 1.0
#: Seconds worker processes get to hand over their records after an interrupt.
WORKER_FLUSH_S = 5.0
#: How far ahead of now the parent sets the start of an open-loop phase's arrival times that it sends its workers.
GO_LEAD_NS = 20_000_000
#: Called with (requests complete, requests failed) of the running phase.
ProgressCallback = Callable[[int, int], None]
#: Where each complete, decoded record goes.
RecordSink = Callable[[Record], None]
#: The reason requests in flight fail with when the run is interrupted (Ctrl-C).
INTERRUPTED = "interrupted"

Item = tuple[int, int, bool]  # (sequence number in the level, input row, warmup)


@dataclass
class PhaseResult:
    """The CPU seconds each client process spent on one phase of a level (its records went to the sink)."""

    cpu_s: list[float]


#: How an open-loop level spaces its requests: exponential gaps (Poisson arrivals), gamma gaps of shape
#: ``burstiness`` (below 1 burstier than Poisson, above 1 steadier; 1 is Poisson), or equal gaps.
ARRIVALS = ("poisson", "gamma", "constant")


#: Keeps the random streams of arrivals (and of drawn lengths, in the runner) apart from the synthetic prompts',
#: which are seeded (run seed, row index): numpy pads shorter seeds with zeros, so a tag beyond any row index is
#: what tells them apart.
ARRIVAL_STREAM = 1 << 40


def arrival_seed(seed: int, level: int, warmup: bool) -> tuple[int, ...]:
    """The seed of a level's arrival times (of its warmup or measured phase) in a run seeded ``seed``."""
    return (seed, ARRIVAL_STREAM, level, int(warmup))


def arrival_offsets(
    count: int, rate: float, *, arrival: str = "poisson", burstiness: float = 1.0, seed: Sequence[int] = (0,)
) -> list[int]:
    """When each of ``count`` requests is due, in ns after the first gap starts, at ``rate`` requests/s on
    average."""
    import numpy as np

    gaps = arrival_gaps(count, 1e9 / rate, arrival=arrival, burstiness=burstiness, seed=seed)
    return np.cumsum(gaps).astype(np.int64).tolist()


def arrival_gaps(
    count: int, mean_gap: float, *, arrival: str = "poisson", burstiness: float = 1.0, seed: Sequence[int] = (0,)
) -> Any:
    """The gaps before each of ``count`` requests (a numpy array, in the unit of ``mean_gap``, their mean)."""
    import numpy as np

    if arrival == "constant":
        return np.full(count, mean_gap)
    if arrival == "gamma":
        return np.random.default_rng(list(seed)).gamma(burstiness, mean_gap / burstiness, count)
    return np.random.default_rng(list(seed)).exponential(mean_gap, count)


def arrivals_within(
    duration_s: float, rate: float, *, arrival: str = "poisson", burstiness: float = 1.0, seed: Sequence[int] = (0,)
) -> int:
    """How many of the arrivals of :func:`arrival_offsets` (same process, same seed) are due within
    ``duration_s``: the first ``count`` offsets of a longer draw are those of a draw of ``count``."""
    limit_ns = duration_s * 1e9
    count = math.ceil(1.5 * rate * duration_s) + 16
    while True:
        offsets = arrival_offsets(count, rate, arrival=arrival, burstiness=burstiness, seed=seed)
        if offsets[-1] > limit_ns:
            return sum(offset <= limit_ns for offset in offsets)
        count *= 2


@dataclass(frozen=True)
class Share:
    """What one process sends during a level: closed loop, its items over ``slots``; open loop, each item when
    its offset (ns after the phase starts) is due."""

    items: list[Item]
    slots: int = 0
    offsets_ns: tuple[int, ...] | None = None
    #: Open loop: at most this many requests in flight (0: no cap); a request due meanwhile waits for one to end.
    cap: int = 0
    #: A level run for a duration: nothing is sent once this long has passed since the phase started.
    duration_ns: int | None = None
    #: Closed loop for a duration: after its items the process sends them again (and again), each round's sequence
    #: numbers advanced by this (the level's measured requests, so that they stay unique across processes).
    cycle: int = 0


def level_label(concurrency: int | None, request_rate: float | None) -> str:
    """``concurrency 4`` or ``rate 2.5/s``."""
    return f"concurrency {concurrency}" if request_rate is None else f"rate {request_rate:g}/s"


@dataclass(frozen=True)
class Level:
    """One load level: ``concurrency`` slots (closed loop) or ``request_rate`` requests/s (open loop), and the input
    rows of its warmup and measured requests, in the order they are sent."""

    index: int
    rows: tuple[int, ...]
    warmup_rows: tuple[int, ...] = ()
    concurrency: int | None = None
    request_rate: float | None = None
    #: Measured requests whose row an earlier request of the run (this level's warmup included) was sent.
    reused_rows: int = 0
    #: Open loop: how the requests are spaced (:data:`ARRIVALS`), the gamma shape, the most in flight (0: any).
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int = 0
    #: Run for this many seconds (the measured phase): closed loop, the slots cycle through ``rows`` until then;
    #: open loop, ``rows`` are the arrivals due within it. None: send ``rows`` once.
    duration_s: float | None = None
    #: A trace replay: when each measured request is due, in ns after the phase starts (instead of ``arrival``).
    schedule_ns: tuple[int, ...] | None = None

    @property
    def num_requests(self) -> int:
        return len(self.rows)

    @property
    def planned(self) -> int | None:
        """Measured requests the level is to send; None for a closed loop run for a duration (as many as fit)."""
        return None if self.duration_s is not None and self.request_rate is None else self.num_requests

    @property
    def warmup(self) -> int:
        return len(self.warmup_rows)

    @property
    def label(self) -> str:
        return level_label(self.concurrency, self.request_rate)

    def items(self, *, warmup: bool) -> list[Item]:
        """The warmup or the measured requests, numbered in one sequence (warmup first)."""
        if warmup:
            return [(seq, row, True) for seq, row in enumerate(self.warmup_rows)]
        return [(self.warmup + j, row, False) for j, row in enumerate(self.rows)]

    def shares(self, workers: int, seed: int, *, warmup: bool) -> list[Share]:
        """Split a phase across ``workers`` processes: closed loop, slots round-robin and requests in proportion
        to slots; open loop, the requests round-robin with their times from one arrival process, so that the
        processes together send the level's shape."""
        items = self.items(warmup=warmup)
        timed = {} if warmup or self.duration_s is None else {"duration_ns": round(self.duration_s * 1e9)}
        if self.request_rate is not None:
            offsets = (
                list(self.schedule_ns)
                if self.schedule_ns is not None and not warmup
                else arrival_offsets(
                    len(items),
                    self.request_rate,
                    arrival=self.arrival,
                    burstiness=self.burstiness,
                    seed=arrival_seed(seed, self.index, warmup),
                )
            )
            # uncapped, the requests go round-robin; capped, each process caps its share, and gets the requests
            # in proportion to its share of the cap
            slots = self.max_concurrency or workers
            return [
                Share(
                    [items[i] for i in picked],
                    offsets_ns=tuple(offsets[i] for i in picked),
                    cap=owned if self.max_concurrency else 0,
                    **timed,
                )
                for picked, owned in _by_slot(len(items), slots, workers)
            ]
        assert self.concurrency is not None
        cycle = {"cycle": self.num_requests} if timed else {}
        return [
            Share([items[i] for i in picked], slots=owned, **timed, **cycle)
            for picked, owned in _by_slot(len(items), self.concurrency, workers)
        ]


def _rounds(items: Sequence[Item], cycle: int) -> Iterator[Item]:
    """``items`` over and over, each round's sequence numbers ``cycle`` past the last round's."""
    for number in itertools.count():
        for seq, row, warmup in items:
            yield seq + number * cycle, row, warmup


async def _acquire_by(semaphore: asyncio.Semaphore, deadline_ns: int | None) -> bool:
    """Acquire ``semaphore`` before ``deadline_ns`` (None: whenever it frees); whether it was acquired."""
    if deadline_ns is None:
        return await semaphore.acquire()
    waiting = asyncio.ensure_future(semaphore.acquire())
    try:
        done, _ = await asyncio.wait({waiting}, timeout=max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9))
    finally:
        if not waiting.done():
            waiting.cancel()
            await asyncio.wait({waiting})
    if done:
        return True
    if not waiting.cancelled():  # acquired as the wait ran out: give it back
        semaphore.release()
    return False


def _by_slot(count: int, slots: int, workers: int) -> list[tuple[list[int], int]]:
    """Per worker, the positions ``0..count-1`` that go to it and how many slots it owns: the slots round-robin
    over the workers, the positions round-robin over the slots."""
    owners = [slot % workers for slot in range(slots)]
    picked: list[list[int]] = [[] for _ in range(workers)]
    for position in range(count):
        picked[owners[position % slots]].append(position)
    return [(picked[worker], owners.count(worker)) for worker in range(workers)]


class LevelRunner:
    """Sends the requests of a process's share of each level over one transport, decodes each as it completes."""

    def __init__(
        self, transport: Transport, workload: Workload, requests: Sequence[Request], *, stream: bool, worker: int = 0
    ) -> None:
        self.transport = transport
        self.workload = workload
        self.requests = list(requests)
        self.stream = stream
        self.worker = worker
        self.payloads: list[Any] = []
        #: Progress of the running phase.
        self.done = 0
        self.errors = 0
        #: CPU seconds this process spent in the last :meth:`run` (all its threads: grpc's included).
        self.cpu_s = 0.0
        self._abort: str | None = None
        self._start_ns = 0
        #: No request goes out from this time on (a level run for a duration).
        self._deadline_ns: int | None = None
        self._sink_error: Exception | None = None
        self._tasks: list[asyncio.Future[Any]] = []
        self._complete: deque[Record] = deque()
        self._wake = asyncio.Event()
        self._audio_rows: set[int] = set()
        self._level = 0
        self._sink: RecordSink = lambda rec: None

    async def open(self, slots: int) -> None:
        await self.transport.open(slots)
        self.payloads = [self.transport.encode(request, stream=self.stream) for request in self.requests]

    def add(self, requests: Sequence[Request]) -> None:
        """More requests, for the rows after those it has (synthetic rows made as the levels need them)."""
        self.requests.extend(requests)
        self.payloads.extend(self.transport.encode(request, stream=self.stream) for request in requests)

    async def close(self) -> None:
        await self.transport.close()

    async def run(self, share: Share, level: int, sink: RecordSink, *, start_ns: int | None = None) -> None:
        """Send ``share`` (of level ``level``); every record, failed or not, goes to ``sink`` once decoded.
        Open loop: the offsets count from ``start_ns`` (``time.perf_counter_ns``; default: now), the one start
        of every process's share.

        A share with a duration sends nothing once it has passed (counted from the same start) and waits for the
        requests in flight: cancelling them would fail them and drop the slowest from the latencies.

        Cancelling this (Ctrl-C) fails the requests in flight as ``interrupted``, hands them to ``sink`` too, and
        re-raises.
        """
        self.done = self.errors = 0
        self._abort = self._sink_error = None
        self._level, self._sink = level, sink
        self._start_ns = start_ns or time.perf_counter_ns()
        self._deadline_ns = None if share.duration_ns is None else self._start_ns + share.duration_ns
        self._audio_rows.clear()
        cpu = time.process_time()
        consumer = asyncio.ensure_future(self._consume())
        try:
            if share.offsets_ns is None:
                items = _rounds(share.items, share.cycle) if share.cycle else iter(share.items)
                callers = [self.transport.caller(stream=self.stream) for _ in range(share.slots)]  # a stream per slot
                self._tasks = [asyncio.ensure_future(self._slot(items, call)) for call in callers]
            elif share.items:
                self._tasks = [asyncio.ensure_future(self._open_loop(share))]
            if self._tasks:
                await self._wait_all()
        finally:
            self._tasks = []
            consumer.cancel()
            if self._sink_error is None:
                self._drain()
            await self.transport.release()
            self.cpu_s = time.process_time() - cpu
        if self._sink_error is not None:
            raise self._sink_error

    async def _wait_all(self) -> None:
        """Wait for the senders (given up ones end cancelled); on Ctrl-C cancel them, and let each hand over its
        request in flight first."""
        try:
            await asyncio.wait(self._tasks)
        except asyncio.CancelledError:
            for task in self._tasks:
                task.cancel()
            await asyncio.wait(self._tasks)
            raise
        for task in self._tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    def abort(self, message: str) -> None:
        """Give up the running phase: send nothing more, fail the requests in flight with ``message``."""
        if self._abort is not None:
            return
        self._abort = message
        self.transport.abort(message)
        for task in self._tasks:
            task.cancel()

    async def _send(self, call: Caller, rec: Record) -> None:
        """Send one request and queue its record (failed, when cancelled: the phase was given up or interrupted)."""
        try:
            await call(self.payloads[rec.row], rec)
        except asyncio.CancelledError:
            if not rec.end_ns:  # not answered in full before the cancellation came
                rec.fail(self._abort or INTERRUPTED, time.perf_counter_ns())
            raise
        except Exception as exc:  # the client's own failure (a transport error it does not know): still a record
            rec.fail(f"client error: {type(exc).__name__}: {short(exc)}", time.perf_counter_ns())
        finally:
            self._finished(rec)

    async def _slot(self, items: Iterator[Item], call: Caller) -> None:
        """Send one request after another; after a request the server did not answer, wait a little longer each
        time before the next (BACKOFF_S doubling up to BACKOFF_MAX_S), so that a dead server is not flooded with
        requests that fail at once while the run finds out it is gone."""
        backoff = 0.0
        try:
            for seq, row, warmup in items:
                if self._abort is not None:
                    return
                if backoff:
                    await asyncio.sleep(backoff)
                if self._deadline_ns is not None and time.perf_counter_ns() >= self._deadline_ns:
                    return
                rec = Record(seq, row, warmup)
                await self._send(call, rec)
                backoff = min(2 * backoff or BACKOFF_S, BACKOFF_MAX_S) if rec.unanswered else 0.0
        except asyncio.CancelledError:
            if self._abort is None:
                raise

    async def _open_loop(self, share: Share) -> None:
        assert share.offsets_ns is not None
        call = self.transport.caller(stream=self.stream)  # one stream for all
        offsets = share.offsets_ns
        tasks: set[asyncio.Future[None]] = set()
        in_flight = asyncio.Semaphore(share.cap) if share.cap else None
        start = self._start_ns
        try:
            for (seq, row, warmup), offset in zip(share.items, offsets, strict=True):
                due = start + offset
                delay = due - time.perf_counter_ns()
                if delay > 0:
                    await asyncio.sleep(delay / 1e9)
                # the wait for a free slot shows as the request's scheduling lag; at the deadline nothing more goes
                if in_flight is not None and not await _acquire_by(in_flight, self._deadline_ns):
                    break
                rec = Record(seq, row, warmup)
                rec.scheduled_ns = due
                task = asyncio.ensure_future(self._send(call, rec))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if in_flight is not None:
                    task.add_done_callback(lambda _: in_flight.release())
            if tasks:
                await asyncio.wait(tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)
            if self._abort is None:
                raise

    def _finished(self, rec: Record) -> None:
        self.done += 1
        if rec.error is not None:
            self.errors += 1
        self._complete.append(rec)
        self._wake.set()

    async def _consume(self) -> None:
        """Decode complete records while the load runs, one at a time, each after what is ready to run (the next
        request of the slot that completed it, the responses that came meanwhile) has run. A record that cannot be
        handed over (the reports cannot be written) gives the phase up: :meth:`run` raises that error."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._complete:
                await asyncio.sleep(0)
                try:
                    self._emit(self._complete.popleft())
                except Exception as exc:
                    self._sink_error = exc
                    self.abort(f"client error: {type(exc).__name__}: {short(exc)}")
                    return

    def _drain(self) -> None:
        while self._complete:
            self._emit(self._complete.popleft())

    def _emit(self, rec: Record) -> None:
        """Decode ``rec`` and hand it to the sink. Audio is kept for the first measured request of each input row of
        a level (what the reports save; with worker processes, of each process's share), not for the others."""
        self.decode(rec)
        if rec.audio is not None and (rec.warmup or rec.row in self._audio_rows):
            rec.audio = None
        elif rec.audio is not None:
            self._audio_rows.add(rec.row)
        self._sink(rec)

    def decode(self, rec: Record) -> None:
        """Read the record's responses through the workload; an unreadable one fails its request."""
        request = self.requests[rec.row]
        chunks: list[Any] = []
        times: list[int] = []
        result = Result()
        if rec.error is None:
            try:
                for arrived, raw in zip(rec.chunk_ns, rec.raw or (), strict=True):
                    chunk = self.workload.parse_chunk(self.transport.decode(raw), request)
                    if chunk.has_content:
                        chunks.append(chunk)
                        times.append(arrived)
                    elif chunk.usage is not None and chunks:  # the counts a stream ends with
                        chunks[-1].usage = chunk.usage
                result = self.workload.finish(request, chunks)
            except Exception as exc:  # a response the workload cannot read is a failed request, not a crash
                rec.error = f"unreadable response: {type(exc).__name__}: {exc}"
                chunks, times, result = [], [], Result()
        rec.chunk_ns = times
        rec.set_result(self._level, self.worker, request, result, chunks)


# --- drivers: this process, or worker processes ----------------------------------------------------------------


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


async def _ticking(period: float, tick: Callable[[], None], work: Any) -> Any:
    """Await ``work`` while calling ``tick`` every ``period`` seconds (and once at the end)."""

    async def ticker() -> None:
        while True:
            await asyncio.sleep(period)
            tick()

    task = asyncio.ensure_future(ticker())
    try:
        return await work
    finally:
        task.cancel()
        tick()


class LocalDriver:
    """Runs the load in this process (``--workers 1``), reporting progress every PROGRESS_INTERVAL seconds."""

    def __init__(self, spec: WorkerSpec, workload: Workload, requests: Sequence[Request]) -> None:
        self._spec = spec
        self._runner = spec.runner(workload, requests)

    async def start(self) -> None:
        await self._runner.open(self._spec.slots)

    async def run_phase(
        self, level: Level, seed: int, progress: ProgressCallback, sink: RecordSink, *, warmup: bool
    ) -> PhaseResult:
        """Run one phase (warmup or measured) of a level; each record goes to ``sink`` as it completes."""
        runner = self._runner
        (share,) = level.shares(1, seed, warmup=warmup)
        await _ticking(
            PROGRESS_INTERVAL, lambda: progress(runner.done, runner.errors), runner.run(share, level.index, sink)
        )
        return PhaseResult([runner.cpu_s])

    def add(self, requests: Sequence[Request]) -> None:
        """More requests, for the rows after those it has."""
        self._runner.add(requests)

    def abort(self, message: str) -> None:
        self._runner.abort(message)

    async def close(self) -> None:
        await self._runner.close()


def _worker_main(conn: Connection, index: int, spec: WorkerSpec, workload: Workload, requests: list[Request]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the parent handles these and stops the workers
        signal.signal(sig, signal.SIG_IGN)
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
            if command == "add":
                runner.add(args[0])
                continue
            if command != "run":
                continue  # an abort that came after the phase had ended
            level, share = args
            conn.send(("armed", None))
            command, *args = conn.recv()
            if command != "go":  # the parent gave up on this level ("stop")
                return
            batch: list[Record] = []
            tick = partial(_report_to_parent, conn, runner, batch)
            await _ticking(PROGRESS_INTERVAL, tick, runner.run(share, level, batch.append, start_ns=args[0]))
            conn.send(("done", PhaseResult([runner.cpu_s])))
    finally:
        await runner.close()


def _report_to_parent(conn: Connection, runner: LevelRunner, batch: list[Record]) -> None:
    """A worker's tick: obey an abort from the parent, report progress with the records completed since the last
    tick."""
    while conn.poll():
        command, *args = conn.recv()
        if command == "abort":
            runner.abort(args[0])
    conn.send(("progress", ((runner.done, runner.errors), batch[:])))
    batch.clear()


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
        self._active: list[Connection] = []
        #: A phase is running: closing now (Ctrl-C, an error) terminates the workers instead of waiting.
        self._busy = False

    async def _receive(self, conns: list[Connection]) -> list[tuple[Connection, str, Any]]:
        """The messages of the workers that have one (an ``error`` for a worker that failed or is gone)."""
        ready = await asyncio.get_running_loop().run_in_executor(None, wait, conns, PROGRESS_INTERVAL)
        messages = []
        for conn in ready:
            try:
                kind, payload = conn.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):
                kind, payload = "error", "the process exited unexpectedly"
            messages.append((conn, kind, payload))
        return messages

    async def _gather(
        self,
        conns: list[Connection],
        expected: str,
        on_progress: Callable[..., None] | None = None,
        results: dict[Connection, Any] | None = None,
    ) -> dict[Connection, Any]:
        """Wait for message ``expected`` from each of ``conns`` (into ``results``, which may hold some already),
        passing progress on; a worker's failure is raised once the other messages that came with it are handled."""
        results = {} if results is None else results
        while len(results) < len(conns):
            failure = None
            for conn, kind, payload in await self._receive([c for c in conns if c not in results]):
                if kind == expected:
                    results[conn] = payload
                elif kind == "progress" and on_progress is not None:
                    on_progress(conn, payload)
                elif kind == "error":
                    failure = failure or payload
            if failure is not None:
                raise TrtDeployError(f"a perf worker failed: {failure}")
        return results

    async def start(self) -> None:
        await self._gather(self._conns, "ready")

    def add(self, requests: Sequence[Request]) -> None:
        """More requests, for the rows after those it has: every worker gets them before its next phase."""
        for conn in self._conns:
            conn.send(("add", list(requests)))

    async def run_phase(
        self, level: Level, seed: int, progress: ProgressCallback, sink: RecordSink, *, warmup: bool
    ) -> PhaseResult:
        """Run one phase (warmup or measured) of a level on every worker that has requests in it.

        Records reach ``sink`` in batches, as the workers report progress. On Ctrl-C the workers are told to give
        up and get WORKER_FLUSH_S seconds to hand over what they have.
        """
        self._busy = True
        shares = level.shares(len(self._conns), seed, warmup=warmup)
        active = [conn for conn, share in zip(self._conns, shares, strict=True) if share.items]
        for conn, share in zip(self._conns, shares, strict=True):
            if share.items:
                conn.send(("run", level.index, share))
        await self._gather(active, "armed")
        # one start for every process's arrival times, a little ahead so that each has it in time
        start_ns = time.perf_counter_ns() + GO_LEAD_NS
        for conn in active:
            conn.send(("go", start_ns))
        self._active = active
        counts: dict[Connection, tuple[int, int]] = {}

        def on_progress(conn: Connection, payload: tuple[tuple[int, int], list[Record]]) -> None:
            counts[conn], records = payload
            for rec in records:
                sink(rec)
            progress(sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values()))

        done: dict[Connection, Any] = {}
        try:
            await self._gather(active, "done", on_progress, done)
        except asyncio.CancelledError:
            self.abort(INTERRUPTED)
            try:  # from the workers that have not finished
                await within(self._gather(active, "done", on_progress, done), WORKER_FLUSH_S)
                self._busy = False
            except asyncio.TimeoutError:
                pass  # what a stuck worker holds is lost; it is terminated on close
            raise
        finally:
            self._active = []
        self._busy = False
        return PhaseResult([cpu for conn in active for cpu in done[conn].cpu_s])

    def abort(self, message: str) -> None:
        for conn in self._active:
            try:
                conn.send(("abort", message))
            except (OSError, ValueError):
                pass

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


def make_transport(protocol: Protocol, url: str, model_name: str, *, timeout_s: float) -> Transport:
    """The transport of one client process: Triton's gRPC or HTTP, or an OpenAI-compatible server's HTTP API."""
    cls: type[Transport]
    if protocol == "openai":
        from .openai_api import OpenAITransport

        cls = OpenAITransport
    else:
        cls = GrpcTransport if protocol == "grpc" else HttpTransport
    return cls(url, model_name, timeout_s=timeout_s)
