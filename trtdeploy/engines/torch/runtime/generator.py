"""The continuous batch: a thread that owns the model, admits requests into free KV-cache slots, and decodes.

:meth:`Generator.submit` only queues a request and returns. The decode thread admits waiting sequences (one batched
prefill), then runs one decode step over every running sequence, and repeats. A step's inputs are on the device once
the step before it has run, so the thread queues step N+1 before it reads the tokens of step N: the GPU does not wait
for the host's work on them (sequences whose next step depends on those tokens, through bans or returned log
probabilities and logits, make the steps run one at a time while they run). Tokens, final outputs and errors go to
each request's :class:`ResponseSink` from a second thread, so sending (an IPC under Triton) overlaps the next step.
An error in a step becomes an error for the requests it touched; the loop itself keeps running.

An encoder-decoder model (Whisper) encodes the admitted sequences' input features, batched, before their prefill;
the prompts are then the decoder's. Where the model overlaps admission (:attr:`SlotModel.overlap_admission`, on a
GPU), encoding and prefill run on a stream of their own while the running sequences go on decoding on a
high-priority stream: the admitted sequences join the batch at the first step after their prefill has finished.
While sequences are decoding, an encoder-decoder model's short prompts (task tokens: a prefill of them costs about
a decode step of the whole batch) are not prefilled but fed to the decode steps one token a step, the tokens those
steps choose for them dropped until the last prompt token's.

Each prompt of a request runs as ``num_return_sequences`` sequences, one slot each. Stop words end a sequence on
their last token (kept); bad words and, before ``min_tokens``, the end tokens are banned in the sampler before each
step. A bad word's ban depends on the tokens so far, so its sequence's steps run in lockstep; the end tokens' ban
depends only on their count, known one step ahead, so ``min_tokens`` leaves the loop one step ahead.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ...contract import (
    Capabilities,
    GenerationRequest,
    ResponseSink,
    SamplingParams,
    SequenceOutput,
    Words,
    encoder_mismatch,
    refusal,
)
from .host import to_host
from .model import PrefillInputs, SlotModel
from .sampling import SlotSampler

log = logging.getLogger(__name__)

CAPABILITIES = Capabilities("torch")
#: Admission batches queued on the admission stream at once: one running, the next waiting for it.
ADMISSIONS_IN_FLIGHT = 2


@dataclass(frozen=True)
class GeneratorConfig:
    """Limits of the continuous batch (``max_slots`` comes from the model's KV cache)."""

    max_input_len: int
    #: Upper bound on ``sequences x longest prompt`` of one batched prefill (one prompt is always admitted).
    max_num_tokens: int = 8192
    #: Longest encoder-decoder prompt fed through decode steps rather than prefilled (see the module's notes).
    max_fed_prompt: int = 8
    #: Default stop tokens (the checkpoint's end-of-sequence ids).
    end_ids: frozenset[int] = frozenset()
    #: Seconds between polls of the sinks' ``is_cancelled``.
    cancel_check_period: float = 0.1


class _Job:
    """A submitted request while it is in flight."""

    __slots__ = ("request", "sink", "stops", "outputs", "pending", "sequences", "done", "context_logits")

    def __init__(self, request: GenerationRequest, sink: ResponseSink, stops: frozenset[int]):
        self.request = request
        self.sink = sink
        self.stops = stops
        self.outputs: list[SequenceOutput] = []
        self.pending = len(request.input_ids) * request.num_return_sequences
        self.sequences: list[_Sequence] = []
        self.done = False
        #: Row -> the prompt's logits ``[prompt, vocab]``, when the request asks for them.
        self.context_logits: dict[int, np.ndarray] = {}


class _Sequence:
    """One return sequence of one prompt of a job: waiting for a slot, then running in it."""

    __slots__ = (
        "job", "row", "index", "prompt", "limit", "slot", "tokens", "log_probs", "cum_log_prob", "logits", "extras",
        "rules", "lockstep", "fed",
    )  # fmt: skip

    def __init__(self, job: _Job, row: int, index: int, prompt: list[int], limit: int):
        self.job = job
        self.row = row
        self.index = index
        self.prompt = prompt
        self.limit = limit
        self.slot: int | None = None
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        #: The sum of ``log_probs``, kept as they come (a streamed piece carries it).
        self.cum_log_prob = 0.0
        self.logits: list[np.ndarray] = []
        request = job.request
        #: Whether each step must fetch this sequence's log probability or logits, and whether it has bans to set.
        #: Extras and bad words need its last token on the host before its next step (see :attr:`lockstep`).
        self.extras = request.return_log_probs or request.return_generation_logits
        self.rules = bool(request.bad_words or request.min_tokens)
        self.lockstep = self.extras or bool(request.bad_words)
        #: Prompt tokens given to the decode steps so far, while the prompt is fed rather than prefilled.
        self.fed = len(prompt)

    @property
    def params(self) -> SamplingParams:
        """The request's sampling settings, seeded ``seed + index`` (TRT-LLM's seeds for its child requests)."""
        sampling = self.job.request.sampling
        return replace(sampling, seed=sampling.seed + self.index) if self.index else sampling

    def tail(self, count: int) -> list[int]:
        """The last ``count`` ids of the prompt followed by the output so far (fewer if there are not as many)."""
        if count <= len(self.tokens):
            return self.tokens[len(self.tokens) - count :]
        return self.prompt[max(len(self.prompt) - (count - len(self.tokens)), 0) :] + self.tokens

    def ends_with_one_of(self, words: Words) -> bool:
        return any(self.tail(len(word)) == list(word) for word in words)

    def banned(self, ahead: int = 0) -> frozenset[int]:
        """The tokens the next step may not choose: the end tokens before ``min_tokens``, and each bad word's last
        token when the sequence ends with the rest of that word. ``ahead``: tokens chosen by a step in flight and
        not read yet (only where the sequence has no bad words)."""
        request = self.job.request
        found = set(self.job.stops) if len(self.tokens) + ahead < request.min_tokens else set()
        found.update(word[-1] for word in request.bad_words if self.tail(len(word) - 1) == list(word[:-1]))
        return frozenset(found)

    def piece(self, logits: np.ndarray | None) -> SequenceOutput:
        """The newest token as a streamed piece (the first piece of a sequence brings the prompt's logits)."""
        if not self.extras and len(self.tokens) > 1:  # the common case, once per token: nothing else to carry
            return SequenceOutput(self.tokens[-1:], row=self.row, index=self.index)
        request = self.job.request
        return SequenceOutput(
            self.tokens[-1:],
            row=self.row,
            index=self.index,
            log_probs=self.log_probs[-1:] if request.return_log_probs else None,
            cum_log_prob=self.cum_log_prob if request.return_log_probs else None,
            generation_logits=None if logits is None else logits[None],
            context_logits=self.job.context_logits.get(self.row) if len(self.tokens) == 1 else None,
        )

    def output(self, vocab_size: int) -> SequenceOutput:
        """The finished sequence (after its prompt when the request keeps the input in the output)."""
        request = self.job.request
        prompt = [] if request.exclude_input else self.prompt
        return SequenceOutput(
            prompt + self.tokens,
            row=self.row,
            index=self.index,
            prompt_tokens=len(prompt),
            log_probs=list(self.log_probs) if request.return_log_probs else None,
            cum_log_prob=self.cum_log_prob if request.return_log_probs else None,
            generation_logits=(np.stack(self.logits) if self.logits else np.zeros((0, vocab_size), np.float32))
            if request.return_generation_logits
            else None,
            context_logits=self.job.context_logits.get(self.row),
        )


#: (send, its arguments, whether later tokens of the same stream may be merged into it)
Event = tuple[Callable[..., None], tuple[Any, ...], bool]


@dataclass
class _Step:
    """A decode step in flight: its sequences, whether its choice for each is dropped (a prompt token is fed next
    instead), its chosen tokens on their way to the host (``ready`` passed: there), and its logits when it runs in
    lockstep (some sequence has bad words or wants extras)."""

    sequences: list[_Sequence]
    dropped: list[bool]
    tokens: torch.Tensor
    ready: torch.cuda.Event | None
    logits: torch.Tensor | None


@dataclass
class _Admission:
    """Sequences given slots and admitted together: their last prompt positions' logits (None when their prompts
    are fed to the decode steps), ready once ``done`` (None: already) has passed. ``inputs``, made on the decode
    stream, is held until then for the admission stream that reads it."""

    batch: list[_Sequence]
    inputs: PrefillInputs | None
    logits: torch.Tensor | None
    done: torch.cuda.Event | None


class Generator:
    """Runs a continuous batch over a :class:`~.model.SlotModel`; thread-safe :meth:`submit`."""

    def __init__(self, model: SlotModel, config: GeneratorConfig):
        self.model = model
        self.config = config
        self.sampler = SlotSampler(
            model.max_slots, model.vocab_size, model.device, capture=model.capture if model.use_graphs else None
        )
        #: Decode steps run, the most sequences one step carried, the steps run while an admission was in flight,
        #: and the prompts fed to decode steps (for tests and stats).
        self.steps = 0
        self.peak_batch = 0
        self.steps_beside_admission = 0
        self.fed_prompts = 0
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[list[Event] | None] = queue.SimpleQueue()
        self._free = list(range(model.max_slots))
        #: Slot -> its sequence: decoding (``_running``) or being admitted (``_admitting``, prefill in flight).
        self._running: dict[int, _Sequence] = {}
        self._admitting: dict[int, _Sequence] = {}
        #: Admissions in flight, in the order the admission stream runs them.
        self._admissions: deque[_Admission] = deque()
        overlap = model.overlap_admission and model.use_graphs
        self._decode_stream = torch.cuda.Stream(model.device, priority=-1) if overlap else None
        self._admission_stream = torch.cuda.Stream(model.device) if overlap else None
        self._waiting: deque[_Sequence] = deque()
        self._jobs: set[_Job] = set()
        self._events: list[Event] = []
        self._freed: list[int] = []
        #: The decode step whose tokens the host has not read yet (the next step is queued before they are read).
        self._in_flight: _Step | None = None
        #: Running sequences whose next step needs the last one's tokens on the host first (:attr:`_Sequence.lockstep`):
        #: while any runs, steps run one at a time.
        self._lockstep = 0
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
        if request.max_new_tokens < 1:
            return f"request_output_len must be at least 1 (got {request.max_new_tokens})"
        problem = refusal(request, CAPABILITIES) or self._check_encoder_input(request)
        if problem:
            return problem
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
        for name, words in (("stop_words", request.stop_words), ("bad_words", request.bad_words)):
            if any(min(word) < 0 or max(word) >= vocab for word in words):
                return f"{name} hold a token id outside the vocabulary [0, {vocab})"
        bias = request.embedding_bias
        if bias is not None and (bias.ndim != 1 or len(bias) > vocab):
            return f"embedding_bias has shape {list(bias.shape)}: it takes one value per token of the {vocab}"
        return None

    def _check_encoder_input(self, request: GenerationRequest) -> str | None:
        features = request.encoder_features
        problem = encoder_mismatch(features is not None, self.model.encoder_decoder)
        if problem or features is None:
            return problem
        if len(features) != len(request.input_ids):
            return f"{len(features)} encoder_input_features for {len(request.input_ids)} decoder prompts"
        if request.return_context_logits:
            return "return_context_logits: the torch engine returns no context logits for an encoder-decoder model"
        return next(filter(None, map(self.model.features_problem, features)), None)

    # --- decode thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        stream = self._decode_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.model.device))  # the model's set-up
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            self._loop_until_closed()

    def _loop_until_closed(self) -> None:
        while True:
            try:
                idle = not (self._running or self._admitting or self._waiting or self._in_flight)
                if not self._intake(block=idle):
                    break
                if time.monotonic() >= self._next_cancel_check:
                    self._drop_cancelled()
                if self._admissions or (self._waiting and self._free):
                    self._admit()
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
                for index in range(job.request.num_return_sequences):
                    sequence = _Sequence(job, row, index, prompt, limit)
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
        """Start the admissions whose prefill has finished, then prefill as many waiting sequences as fit the free
        slots and the token budget, in one batch.

        Where admission overlaps decoding, up to :data:`ADMISSIONS_IN_FLIGHT` batches are queued on the admission
        stream: the next one is queued while one runs, so that stream never waits for the host, and it takes every
        sequence that arrived meanwhile (a larger batch encodes more cheaply per input).
        """
        while self._admissions:
            admission = self._admissions[0]
            if self._running and admission.done is not None and not admission.done.query():
                break  # still encoding or prefilling: the running sequences step meanwhile
            self._admissions.popleft()
            self._start(admission)
        if self._waiting and self._free and len(self._admissions) < ADMISSIONS_IN_FLIGHT:
            admission = self._launch()
            if admission is None:
                return
            if admission.done is None or not self._running:
                self._start(admission)  # nothing to overlap with
            else:
                self._admissions.append(admission)

    def _launch(self) -> _Admission | None:
        """Give waiting sequences slots and prefill them (encoding first, for an encoder-decoder model): on the
        admission stream where admission overlaps decoding, else at once."""
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
            self._admitting[sequence.slot] = sequence
            batch.append(sequence)
            longest = widest
        if not batch:
            return None
        prompts = [sequence.prompt for sequence in batch]
        slots = [sequence.slot for sequence in batch]
        stream = self._admission_stream
        try:
            done = None
            fed = self.model.encoder_decoder and bool(self._running) and all(map(self._feedable, batch))
            inputs = None if fed else self.model.stage_prefill(prompts, slots)
            if stream is not None:
                # Decode steps still write K/V at these slots' positions: park them past the prompts being written.
                self.model.park(slots)
                stream.wait_stream(torch.cuda.current_stream(self.model.device))
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                if self.model.encoder_decoder:
                    features = [sequence.job.request.encoder_features[sequence.row] for sequence in batch]
                    self.model.encode(slots, features)
                logits = None if inputs is None else self.model.run_prefill(inputs)
                if stream is not None:
                    done = torch.cuda.Event()
                    done.record(stream)
        except Exception as exc:
            if stream is not None:
                stream.synchronize()  # before the inputs it may still read are freed
            self._fail_admission(batch, exc)
            return None
        return _Admission(batch, inputs, logits, done)

    def _start(self, admission: _Admission) -> None:
        """Sample the admitted sequences' first tokens and make the unfinished ones decode."""
        if admission.done is not None:
            torch.cuda.current_stream(self.model.device).wait_event(admission.done)
        live = [i for i, sequence in enumerate(admission.batch) if self._admitting.get(sequence.slot) is sequence]
        batch = [admission.batch[i] for i in live]
        for sequence in batch:
            del self._admitting[sequence.slot]
            self._running[sequence.slot] = sequence
            self._lockstep += sequence.lockstep
        if not batch:
            return
        try:
            # The sampler takes the slots only now: steps that ran during the admission counted their choices
            # for every slot of the batch where any slot has penalties.
            requests = [sequence.job.request for sequence in batch]
            self.sampler.assign(
                [sequence.slot for sequence in batch],
                [sequence.params for sequence in batch],
                [sequence.prompt for sequence in batch],
                biases=[request.embedding_bias for request in requests],
                log_probs=[request.return_log_probs for request in requests],
            )
            for sequence in batch:
                self._ban(sequence)
            if admission.logits is None:
                self.model.start([s.slot for s in batch], [s.prompt[0] for s in batch], [0] * len(batch))
                for sequence in batch:
                    sequence.fed = 1
                self.fed_prompts += len(batch)
                return
            logits = admission.logits[live] if len(live) < len(admission.batch) else admission.logits
            for sequence in batch:
                job = sequence.job
                if job.request.return_context_logits and sequence.row not in job.context_logits:
                    job.context_logits[sequence.row] = self.model.prompt_logits(sequence.prompt).cpu().numpy()
            last = torch.as_tensor([len(sequence.prompt) - 1 for sequence in batch], device=self.model.device)
            first = self.sampler.sample(logits, [sequence.slot for sequence in batch], last).tolist()
            extras = self._extras(batch, logits, list(range(len(batch))))
        except Exception as exc:
            self._fail_admission(batch, exc)
            return
        starting = [
            sequence
            for sequence, token, (log_prob, token_logits) in zip(batch, first, extras, strict=True)
            if not self._accept(sequence, token, log_prob, token_logits)
        ]
        if starting:
            self.model.start(
                [s.slot for s in starting], [s.tokens[-1] for s in starting], [len(s.prompt) for s in starting]
            )

    def _fail_admission(self, batch: list[_Sequence], exc: Exception) -> None:
        log.exception("prefill failed")
        for sequence in batch:
            self._fail(sequence.job, f"prefill failed: {exc}")

    def _feedable(self, sequence: _Sequence) -> bool:
        """Whether a sequence's prompt may be fed to the decode steps: a short one, and nothing that the dropped
        choices would change (penalties count the chosen tokens; log probabilities and logits are returned)."""
        return len(sequence.prompt) <= self.config.max_fed_prompt and not (sequence.extras or sequence.params.penalised)

    def _extras(
        self, sequences: list[_Sequence], logits: torch.Tensor, rows: list[int]
    ) -> list[tuple[float, np.ndarray | None]]:
        """Per sequence (whose logits are row ``rows[i]`` of ``logits``): its chosen token's log probability and the
        step's raw logits, where its request asks for them."""
        log_probs = [0.0] * len(sequences)
        if any(s.job.request.return_log_probs for s in sequences):
            log_probs = self.sampler.log_probs_of([s.slot for s in sequences])
        wanted = [i for i, s in enumerate(sequences) if s.job.request.return_generation_logits]
        found: dict[int, np.ndarray] = {}
        if wanted:
            values = logits[[rows[i] for i in wanted]].float().cpu().numpy()
            found = dict(zip(wanted, values, strict=True))
        return [(log_prob, found.get(i)) for i, log_prob in enumerate(log_probs)]

    def _step(self) -> None:
        """Queue a decode step over every running sequence, then read the last step's tokens while it runs.

        A step's inputs are on the device when the one before it has run (its chosen tokens, fed prompt tokens), so
        the host queues step N+1 before it reads the tokens of step N: the GPU never waits for the host's work on
        them. A sequence that finished at step N has run step N+1 too: that choice is ignored, its write lands at
        the last position its limit leaves room for, and freeing the slot takes its position back to 0
        (:meth:`SlotModel.stop`).
        """
        lockstep = self._lockstep > 0
        if lockstep:
            self._finish_in_flight()  # the next step's bans come from its tokens
        step = self._launch_step(lockstep) if self._running else None
        self._finish_in_flight()
        self._in_flight = step
        if lockstep:
            self._finish_in_flight()  # before its logits are overwritten

    def _launch_step(self, lockstep: bool) -> _Step | None:
        running = self._running
        top = max(running) + 1
        # the tokens of the step in flight are not counted yet
        span = max(len(s.prompt) + len(s.tokens) for s in running.values()) + (self._in_flight is not None)
        batch, span = self.model.buckets(top, span)
        sequences = list(running.values())
        # only the columns the running sequences' biases leave, unless one returns its logits
        full = lockstep and any(sequence.job.request.return_generation_logits for sequence in sequences)
        columns = None if full else self.sampler.columns(list(running))
        try:
            self._ban_ahead(sequences)
            logits = self.model.decode(batch, span, columns)
            chosen = self.sampler.sample_decode(logits, self.model.positions[:batch], columns)
            self.model.advance(batch, chosen)
            tokens, ready = to_host(chosen)
            # A sequence whose prompt is still going through the steps: the step's choice is dropped, and the next
            # prompt token is fed instead.
            dropped = [sequence.fed < len(sequence.prompt) for sequence in sequences]
            feeding = [sequence for sequence, drop in zip(sequences, dropped, strict=True) if drop]
            if feeding:
                self.model.feed([s.slot for s in feeding], [s.prompt[s.fed] for s in feeding])
                for sequence in feeding:
                    sequence.fed += 1
        except Exception as exc:
            self._fail_step(sequences, exc)
            return None
        self.steps += 1
        self.steps_beside_admission += bool(self._admissions)
        self.peak_batch = max(self.peak_batch, len(running))
        return _Step(sequences, dropped, tokens, ready, logits if lockstep else None)

    def _finish_in_flight(self) -> None:
        """Read the step in flight's tokens and give them to their sequences (those still running)."""
        step, self._in_flight = self._in_flight, None
        if step is None:
            return
        try:
            if step.ready is not None:
                step.ready.synchronize()
            tokens = step.tokens.tolist()
            extras = None
            if step.logits is not None:  # a lockstep step: read before any other step ran or any sequence ended
                extras = self._extras(step.sequences, step.logits, [sequence.slot for sequence in step.sequences])
        except Exception as exc:
            self._fail_step(step.sequences, exc)
            return
        for row, (sequence, dropped) in enumerate(zip(step.sequences, step.dropped, strict=True)):
            if dropped or sequence.slot is None or self._running.get(sequence.slot) is not sequence:
                continue  # a prompt token is fed next, or the sequence has finished or failed since
            if extras is None:
                self._accept(sequence, tokens[sequence.slot])
            else:
                self._accept(sequence, tokens[sequence.slot], *extras[row])

    def _fail_step(self, sequences: list[_Sequence], exc: Exception) -> None:
        log.exception("decode step failed")
        for job in {sequence.job for sequence in sequences}:
            self._fail(job, f"decode step failed: {exc}")

    def _accept(self, sequence: _Sequence, token: int, log_prob: float = 0.0, logits: np.ndarray | None = None) -> bool:
        """Record a sequence's new token; True when the sequence is finished (its slot is then free)."""
        job = sequence.job
        request = job.request
        if token in job.stops:
            finished = True
        else:
            sequence.tokens.append(token)
            if sequence.extras:
                sequence.log_probs.append(log_prob)
                sequence.cum_log_prob += log_prob
                if logits is not None:
                    sequence.logits.append(logits)
            if request.streaming:
                # a stream's first token always goes out alone: coalescing never delays the time to first token
                self._events.append((job.sink.send_tokens, (sequence.piece(logits),), len(sequence.tokens) > 1))
            finished = len(sequence.tokens) >= sequence.limit or (
                bool(request.stop_words) and sequence.ends_with_one_of(request.stop_words)
            )
        if not finished:
            return False
        self._release(sequence)
        if not request.streaming:
            job.outputs.append(sequence.output(self.model.vocab_size))
        job.pending -= 1
        if job.pending == 0:
            job.done = True
            self._jobs.discard(job)
            outputs = sorted(job.outputs, key=lambda output: (output.row, output.index))
            self._events.append((job.sink.send_final, (None if request.streaming else outputs,), False))
        return True

    def _ban(self, sequence: _Sequence, ahead: int = 0) -> None:
        """Set the sampler's bans for the sequence's next token (only requests with word or length rules have any)."""
        if sequence.rules:
            self.sampler.set_bans(sequence.slot, sequence.banned(ahead))

    def _ban_ahead(self, sequences: list[_Sequence]) -> None:
        """Set the bans of the step about to be queued, counting the token the step in flight gives each sequence
        (a lockstep sequence has none in flight: its tokens were read before this step)."""
        ruled = [sequence for sequence in sequences if sequence.rules]
        if not ruled:
            return
        step = self._in_flight
        given = (
            {id(s) for s, dropped in zip(step.sequences, step.dropped, strict=True) if not dropped}
            if step is not None
            else set()
        )
        for sequence in ruled:
            self._ban(sequence, ahead=int(id(sequence) in given))

    def _release(self, sequence: _Sequence) -> None:
        slot, sequence.slot = sequence.slot, None
        if self._running.get(slot) is sequence:
            del self._running[slot]
            self._lockstep -= sequence.lockstep
        elif self._admitting.get(slot) is sequence:
            del self._admitting[slot]
        else:
            return
        heapq.heappush(self._free, slot)
        self.sampler.release(slot)
        self._freed.append(slot)

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
    """Merge each sequence's consecutive mergeable ``send_tokens`` events into one, keeping every sink's own order."""
    merged: list[Event] = []
    gathered: dict[int, list[SequenceOutput]] = {}  # index in merged of a send_tokens event -> the pieces it sends
    open_pieces: dict[tuple[int, int, int], int] = {}  # (sink, row, index) -> index in merged of its open piece
    for send, args, mergeable in events:
        sink = id(send.__self__)
        if not mergeable:
            for key in [key for key in open_pieces if key[0] == sink]:
                del open_pieces[key]
            merged.append((send, args, mergeable))
            continue
        piece = args[0]  # only send_tokens events are mergeable
        key = (sink, piece.row, piece.index)
        if key in open_pieces:
            gathered[open_pieces[key]].append(piece)
        else:
            open_pieces[key] = len(merged)
            gathered[len(merged)] = [piece]
            merged.append((send, args, mergeable))
    for position, pieces in gathered.items():
        if len(pieces) > 1:
            merged[position] = (merged[position][0], (SequenceOutput.joined(pieces),), True)
    return merged
