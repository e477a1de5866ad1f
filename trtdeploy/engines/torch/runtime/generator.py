"""The continuous batch: a thread that owns the model, admits requests into free KV-cache slots, and decodes.

:meth:`Generator.submit` only queues a request and returns. The decode thread admits waiting sequences (one batched
prefill), then runs one decode step over every running sequence, and repeats. Tokens, final outputs and errors go to
each request's :class:`ResponseSink` from a second thread, so sending (an IPC under Triton) overlaps the next step.
An error in a step becomes an error for the requests it touched; the loop itself keeps running.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...contract import GenerationRequest, ResponseSink
from .model import DecoderModel
from .sampling import SlotSampler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GeneratorConfig:
    """Limits of the continuous batch (``max_slots`` comes from the model's KV cache)."""

    max_input_len: int
    #: Upper bound on ``sequences x longest prompt`` of one batched prefill (one prompt is always admitted).
    max_num_tokens: int = 8192
    #: Default stop tokens (the checkpoint's end-of-sequence ids).
    end_ids: frozenset[int] = frozenset()
    #: Seconds between polls of the sinks' ``is_cancelled``.
    cancel_check_period: float = 0.1
    #: The checkpoint's pad id: what ``output_ids`` rows are padded with when a request sets no ``pad_id``.
    pad_id: int = 0


class _Job:
    """A submitted request while it is in flight."""

    __slots__ = ("request", "sink", "stops", "outputs", "pending", "sequences", "done")

    def __init__(self, request: GenerationRequest, sink: ResponseSink, stops: frozenset[int]):
        self.request = request
        self.sink = sink
        self.stops = stops
        self.outputs: list[list[int]] = [[] for _ in request.input_ids]
        self.pending = len(request.input_ids)
        self.sequences: list[_Sequence] = []
        self.done = False


class _Sequence:
    """One prompt of a job: waiting for a slot, then running in it."""

    __slots__ = ("job", "row", "prompt", "limit", "slot", "tokens")

    def __init__(self, job: _Job, row: int, prompt: list[int], limit: int):
        self.job = job
        self.row = row
        self.prompt = prompt
        self.limit = limit
        self.slot: int | None = None
        self.tokens: list[int] = []


#: (send, its arguments, whether later tokens of the same stream may be merged into it)
Event = tuple[Callable[..., None], tuple[Any, ...], bool]


class Generator:
    """Runs a continuous batch over a :class:`DecoderModel`; thread-safe :meth:`submit`."""

    def __init__(self, model: DecoderModel, config: GeneratorConfig):
        self.model = model
        self.config = config
        self.sampler = SlotSampler(
            model.max_slots, model.vocab_size, model.device, capture=model.capture if model.use_graphs else None
        )
        self.pad_id = config.pad_id
        #: Decode steps run, and the most sequences one step carried (for tests and stats).
        self.steps = 0
        self.peak_batch = 0
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[list[Event] | None] = queue.SimpleQueue()
        self._free = list(range(model.max_slots))
        self._running: dict[int, _Sequence] = {}
        self._waiting: deque[_Sequence] = deque()
        self._jobs: set[_Job] = set()
        self._events: list[Event] = []
        self._freed: list[int] = []
        self._next_cancel_check = 0.0
        self._loop = threading.Thread(target=self._run, name="trtdeploy-decode", daemon=True)
        self._sender = threading.Thread(target=self._send, name="trtdeploy-send", daemon=True)
        self._loop.start()
        self._sender.start()

    # --- API ----------------------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, sink: ResponseSink) -> None:
        """Queue a request; its results (or an error) arrive at ``sink``. Never blocks on generation."""
        problem = self._check(request)
        if problem:
            sink.send_error(problem)
            return
        self._inbox.put(_Job(request, sink, request.stop_ids(self.config.end_ids)))

    def close(self, timeout: float = 30.0) -> None:
        """Stop the decode thread; requests still in flight get an error."""
        self._inbox.put(None)
        self._loop.join(timeout)
        self._sender.join(timeout)

    # --- checks -------------------------------------------------------------------------------------------------

    def _check(self, request: GenerationRequest) -> str | None:
        if not request.input_ids:
            return "the request holds no input_ids"
        if request.streaming and len(request.input_ids) > 1:
            return f"streaming takes one sequence per request (got a batch of {len(request.input_ids)})"
        if request.max_new_tokens < 1:
            return f"request_output_len must be at least 1 (got {request.max_new_tokens})"
        vocab = self.model.vocab_size
        for prompt in request.input_ids:
            if not prompt:
                return "input_lengths is 0: the prompt is empty"
            if len(prompt) > self.config.max_input_len:
                return f"input length {len(prompt)} exceeds max_input_len {self.config.max_input_len}"
            if len(prompt) >= self.model.max_seq_len:
                return f"input length {len(prompt)} leaves no room below max_seq_len {self.model.max_seq_len}"
            if min(prompt) < 0 or max(prompt) >= vocab:
                return f"input_ids hold a token id outside the vocabulary [0, {vocab})"
        return None

    # --- decode thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                if not self._intake(block=not self._running and not self._waiting):
                    break
                if time.monotonic() >= self._next_cancel_check:
                    self._drop_cancelled()
                if self._waiting and self._free:
                    self._admit()
                if self._running:
                    self._step()
            except Exception as exc:  # a bug in the loop itself: fail what is in flight, keep serving
                log.exception("decode loop error")
                for job in list(self._jobs):
                    self._fail(job, f"internal error in the torch runtime: {exc}")
            self._flush()
        for job in list(self._jobs):
            self._fail(job, "the model is shutting down")
        self._flush()
        self._outbox.put(None)

    def _intake(self, block: bool) -> bool:
        """Move submitted requests to the waiting line; False once :meth:`close` was called."""
        while True:
            try:
                job = self._inbox.get() if block else self._inbox.get_nowait()
            except queue.Empty:
                return True
            block = False
            if job is None:
                return False
            self._jobs.add(job)
            room = self.model.max_seq_len
            for row, prompt in enumerate(job.request.input_ids):
                limit = min(job.request.max_new_tokens, room - len(prompt))
                sequence = _Sequence(job, row, prompt, limit)
                job.sequences.append(sequence)
                self._waiting.append(sequence)

    def _drop_cancelled(self) -> None:
        self._next_cancel_check = time.monotonic() + self.config.cancel_check_period
        for job in list(self._jobs):
            try:
                cancelled = job.sink.is_cancelled()
            except Exception:
                log.exception("is_cancelled failed")
                cancelled = False
            if cancelled:
                self._fail(job, "the request was cancelled", cancelled=True)

    def _admit(self) -> None:
        """Prefill as many waiting sequences as fit the free slots and the token budget, in one batch."""
        self._stop_freed()  # before a freed slot is reused
        batch: list[_Sequence] = []
        longest = 0
        while self._waiting and self._free:
            sequence = self._waiting[0]
            if sequence.job.done:
                self._waiting.popleft()
                continue
            widest = max(longest, len(sequence.prompt))
            if batch and widest * (len(batch) + 1) > self.config.max_num_tokens:
                break
            self._waiting.popleft()
            sequence.slot = heapq.heappop(self._free)
            self._running[sequence.slot] = sequence
            batch.append(sequence)
            longest = widest
        if not batch:
            return
        prompts = [sequence.prompt for sequence in batch]
        slots = [sequence.slot for sequence in batch]
        try:
            self.sampler.assign(slots, [s.job.request.sampling for s in batch], prompts)
            logits = self.model.prefill(prompts, slots)
            last = torch.as_tensor([len(prompt) - 1 for prompt in prompts], device=self.model.device)
            first = self.sampler.sample(logits, slots, last).tolist()
        except Exception as exc:
            log.exception("prefill failed")
            for sequence in batch:
                self._fail(sequence.job, f"prefill failed: {exc}")
            return
        starting = [s for s, token in zip(batch, first, strict=True) if not self._accept(s, token)]
        if starting:
            self.model.start(
                [s.slot for s in starting], [s.tokens[-1] for s in starting], [len(s.prompt) for s in starting]
            )

    def _step(self) -> None:
        """One decode step over every running sequence."""
        running = self._running
        top = max(running) + 1
        span = max(len(s.prompt) + len(s.tokens) for s in running.values())
        batch, span = self.model.buckets(top, span)
        try:
            logits = self.model.decode(batch, span)
            chosen = self.sampler.sample_decode(logits, self.model.positions[:batch])
            self.model.advance(batch, chosen)
            tokens = chosen.tolist()
        except Exception as exc:
            log.exception("decode step failed")
            for job in {sequence.job for sequence in running.values()}:
                self._fail(job, f"decode step failed: {exc}")
            return
        self.steps += 1
        self.peak_batch = max(self.peak_batch, len(running))
        for slot, sequence in list(running.items()):
            self._accept(sequence, tokens[slot])

    def _accept(self, sequence: _Sequence, token: int) -> bool:
        """Record a sequence's new token; True when the sequence is finished (its slot is then free)."""
        job = sequence.job
        if token in job.stops:
            finished = True
        else:
            sequence.tokens.append(token)
            if job.request.streaming:
                # a stream's first token always goes out alone: coalescing never delays the time to first token
                self._events.append((job.sink.send_tokens, ([token],), len(sequence.tokens) > 1))
            finished = len(sequence.tokens) >= sequence.limit
        if finished:
            self._release(sequence)
            request = job.request
            job.outputs[sequence.row] = sequence.tokens if request.exclude_input else sequence.prompt + sequence.tokens
            job.pending -= 1
            if job.pending == 0:
                job.done = True
                self._jobs.discard(job)
                self._events.append((job.sink.send_final, (None if request.streaming else job.outputs,), False))
        return finished

    def _release(self, sequence: _Sequence) -> None:
        slot = sequence.slot
        if slot is not None and self._running.get(slot) is sequence:
            del self._running[slot]
            heapq.heappush(self._free, slot)
            self.sampler.release(slot)
            self._freed.append(slot)
        sequence.slot = None

    def _fail(self, job: _Job, message: str, cancelled: bool = False) -> None:
        if job.done:
            return
        job.done = True
        self._jobs.discard(job)
        for sequence in job.sequences:
            self._release(sequence)
        self._events.append((job.sink.send_error, (message, cancelled), False))

    def _stop_freed(self) -> None:
        if self._freed:
            freed, self._freed = self._freed, []
            self.model.stop(freed)

    def _flush(self) -> None:
        try:
            self._stop_freed()
        except Exception:
            log.exception("freeing slots failed")
        if self._events:
            self._outbox.put(self._events)
            self._events = []

    # --- sender thread ------------------------------------------------------------------------------------------

    def _send(self) -> None:
        while True:
            events = self._outbox.get()
            closing = events is None
            # Whatever piled up while the last responses went out is sent now, each stream's tokens as one response:
            # with many streams the sends (IPC to Triton) cost more than a decode step, and this keeps them in step.
            while not closing:
                try:
                    more = self._outbox.get_nowait()
                except queue.Empty:
                    break
                closing = more is None
                events = (events or []) + (more or [])
            for send, args, _ in coalesce_tokens(events or []):
                try:
                    send(*args)
                except Exception:
                    log.exception("sending a response failed")
            if closing:
                return


def coalesce_tokens(events: list[Event]) -> list[Event]:
    """Merge each sink's consecutive mergeable ``send_tokens`` events into one, keeping every sink's own order."""
    merged: list[Event] = []
    pending: dict[int, int] = {}  # sink -> index in merged of its open send_tokens event
    for send, args, mergeable in events:
        sink = id(send.__self__)
        if mergeable and sink in pending:
            previous = merged[pending[sink]]
            merged[pending[sink]] = (previous[0], (previous[1][0] + args[0],), True)
        elif mergeable:  # only send_tokens events are mergeable
            pending[sink] = len(merged)
            merged.append((send, (list(args[0]),), mergeable))
        else:
            pending.pop(sink, None)
            merged.append((send, args, mergeable))
    return merged
