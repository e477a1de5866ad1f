"""The perf engine: load one Triton (or OpenAI-compatible) endpoint with a workload, level by level, and summarize
each level.

It knows nothing of trtdeploy's deployments or server records (that is :mod:`trtdeploy.benchmark`): it takes an
endpoint, a workload and its input rows, and hands every record and every level summary to an observer as soon as
they exist, so that a run cut short (the server lost, Ctrl-C) keeps everything measured until then.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import PerfError, ServerError, UsageError
from .control import ControlClient, failure_reason, within
from .control import Protocol as Transport
from .inputs import OWN_BLOCK, PREFIX_BLOCK, PromptLayout
from .loadgen import (
    ARRIVAL_STREAM,
    ARRIVALS,
    Level,
    LocalDriver,
    PhaseResult,
    WorkerPool,
    WorkerSpec,
    arrival_seed,
    arrivals_within,
    level_label,
)
from .metrics import DEFINITIONS, LevelStats
from .records import Record
from .search import FINDS, MAX_STEPS, Search, check_search
from .slo import Slo
from .stats import GaugeSampler, Snapshot, server_delta, snapshot
from .trace import Trace
from .workload import InputRow, ModelInfo, RequestOptions, Workload

if TYPE_CHECKING:
    from .openai_api import OpenAIControl

#: Prompt length of the synthetic inputs used when no input is given (at most the deployment's max_input_len).
DEFAULT_ISL = 128
#: The fewest measured requests per level with synthetic inputs or in a search (4 x concurrency above that).
SYNTHETIC_MIN = 16
#: The longest a searched open-loop level without --duration should take to send its requests (see lowest_search_rate).
SEARCH_LEVEL_S = 60.0
#: Pause before a statistics snapshot: Triton counts a request when it releases it, just after its last response.
STATS_SETTLE_S = 0.05
#: While a level runs the server's liveness is probed every PROBE_INTERVAL_S (and right after requests fail), each
#: probe waiting at most PROBE_TIMEOUT_S; LOST_AFTER_PROBES failed probes in a row end the level: server lost.
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 3.0
LOST_AFTER_PROBES = 2
#: The least time between two probes.
PROBE_GAP_S = 0.25


class ProgressReporter(Protocol):
    def start_level(self, label: str, total: int | None) -> None:
        """A level starts: ``total`` requests, warmup included (None: as many as its duration takes)."""

    def update(self, done: int, errors: int) -> None: ...
    def finish_level(self) -> None: ...


class _NoProgress:
    def start_level(self, label: str, total: int | None) -> None: ...
    def update(self, done: int, errors: int) -> None: ...
    def finish_level(self) -> None: ...


class RunObserver(Protocol):
    """Gets a run's parts as they exist: what the run is, every finished record, every level's summary."""

    def started(self, header: dict[str, Any]) -> None: ...
    def record(self, rec: Record, level: Level, metrics: dict[str, Any] | None) -> None:
        """A finished record of ``level`` and its per-request metrics (None for a failed one)."""

    def flush(self) -> None:
        """Called about every PROGRESS_INTERVAL while a level runs: make the records so far durable."""

    def level_done(self, summary: dict[str, Any]) -> None: ...


class RunCollector:
    """A :class:`RunObserver` that keeps every record in memory (tests, library use; reports stream to disk)."""

    def __init__(self) -> None:
        self.header: dict[str, Any] = {}
        self.records: list[Record] = []
        self.levels: list[dict[str, Any]] = []

    def started(self, header: dict[str, Any]) -> None:
        self.header = header

    def record(self, rec: Record, level: Level, metrics: dict[str, Any] | None) -> None:
        self.records.append(rec)

    def flush(self) -> None:
        """Nothing to make durable: the records are in memory."""

    def level_done(self, summary: dict[str, Any]) -> None:
        self.levels.append(summary)


class ServerLost(ServerError):
    """The server stopped answering while a level ran: the level was given up."""


@dataclass(frozen=True)
class LoadSettings:
    """The levels of a run and how they are driven.

    Input rows are fresh: warmup and measured requests take the rows in order across the whole run, so no request
    repeats a prompt an earlier one sent (a prefix cache would serve it). With ``reuse_rows`` every level (its
    warmup included) walks the rows from the first: for cache studies. Requests per level (``num_requests`` None):
    closed loop max(4 x concurrency, the rows' share), open loop max(10 s of arrivals, the rows' share), where the
    share divides the rows left after the warmups evenly among the levels (all of them with ``reuse_rows``), and
    synthetic inputs count SYNTHETIC_MIN. Warmup requests per level (``warmup`` None): one per slot (the
    concurrency) in closed loop, none in open loop. Open-loop requests come at the times of ``arrival``
    (:data:`~trtdeploy.perf.loadgen.ARRIVALS`): Poisson, gamma gaps of shape ``burstiness``, or constant gaps; with
    ``max_concurrency``, no more than that many in flight (a request due meanwhile waits for one to end).

    With ``duration_s`` a level's measured phase runs for that long instead of a request count: closed loop, the
    slots cycle through the level's requests (reusing their rows) until then; open loop, its requests are the
    arrivals due within it (one still waiting for a free slot at the end is not sent). No request is sent after
    it, and the requests in flight are waited for.

    With ``find`` (:data:`~trtdeploy.perf.search.FINDS`) the levels are not given but searched for, from the one
    concurrency or request rate given (:class:`~trtdeploy.perf.search.Search`); each level sends at least
    SYNTHETIC_MIN requests whatever the input (the rows' share with ``reuse_rows``).

    With ``schedule_ns`` (a trace, ``--trace``) the run is one open-loop level that sends request ``i`` of the
    trace (input row ``i``) ``schedule_ns[i]`` ns after the level starts: all of them, the first ``num_requests``, or
    those due within ``duration_s`` (:attr:`replayed`); its request rate is theirs on average (:attr:`values`).
    """

    concurrency: tuple[int, ...] = (1,)
    request_rates: tuple[float, ...] = ()
    num_requests: int | None = None
    warmup: int | None = None
    workers: int = 1
    timeout_s: float = 600.0
    seed: int = 0
    reuse_rows: bool = False
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int = 0
    duration_s: float | None = None
    find: str | None = None
    schedule_ns: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UsageError(f"--workers must be >= 1, got {self.workers}")
        if self.arrival not in ARRIVALS:
            raise UsageError(f"--arrival {self.arrival!r} is not one of {', '.join(ARRIVALS)}")
        if self.arrival != "poisson" and not self.open_loop:
            raise UsageError(f"--arrival {self.arrival} spaces open-loop requests", hint="pass --request-rate too")
        if not 0 < self.burstiness < math.inf:
            raise UsageError(f"--burstiness must be > 0, got {self.burstiness:g}", hint="e.g. 0.5 (burstier)")
        if self.max_concurrency < 0:
            raise UsageError(f"--max-concurrency must be >= 0 (0: no cap), got {self.max_concurrency}")
        if self.max_concurrency and not self.open_loop:
            raise UsageError(
                "--max-concurrency caps open-loop levels",
                hint="pass --request-rate, or --concurrency for a closed loop",
            )
        if self.max_concurrency and self.max_concurrency < self.workers:
            raise UsageError(
                f"--max-concurrency {self.max_concurrency} is less than --workers {self.workers}",
                hint="each client process needs one request in flight at least",
            )
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise UsageError(
                "--burstiness is the shape of gamma arrivals", hint="pass --arrival gamma with --burstiness"
            )
        bad = [rate for rate in self.request_rates if not (0 < rate < math.inf)]
        if bad:
            raise UsageError(f"--request-rate values must be > 0, got {bad[0]:g}", hint="e.g. --request-rate 5,10")
        if self.num_requests is not None and self.num_requests < 1:
            raise UsageError(f"--num-requests must be >= 1, got {self.num_requests}")
        if self.duration_s is not None and not 0 < self.duration_s < math.inf:
            raise UsageError(f"--duration must be > 0 seconds, got {self.duration_s:g}", hint="e.g. --duration 60")
        if self.schedule_ns:
            self._check_replay()
        if self.find is not None:
            self._check_find(self.find)
        if self.duration_s is not None and self.num_requests is not None:
            raise UsageError(
                "--duration and --num-requests are exclusive: a level runs for a time or for a count of requests",
                hint="choose one",
            )
        if self.duration_s is not None and self.open_loop:
            slowest = min(self.values)
            if slowest * self.duration_s < 1:
                raise UsageError(
                    f"--duration {self.duration_s:g} s at --request-rate {slowest:g}/s expects no request at all",
                    hint=f"run for at least {1 / slowest:g} s, or at a higher rate",
                )
        if self.warmup is not None and self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        if self.timeout_s <= 0:
            raise UsageError(f"--timeout must be > 0, got {self.timeout_s:g}")

    def _check_replay(self) -> None:
        """A trace replay is one open-loop level at the trace's times, from its first request."""
        if self.request_rates:
            raise UsageError("--trace sends its requests at the trace's times", hint="leave out --request-rate")
        if self.arrival != "poisson":
            raise UsageError(f"--arrival {self.arrival} spaces requests of a --request-rate, not of a --trace")
        if self.find is not None:
            raise UsageError("--find searches for a level, and --trace replays one", hint="leave out --find")
        if self.warmup:
            raise UsageError("a --trace is replayed from its first request, without warmup", hint="leave out --warmup")
        replayed = self.replayed
        if len(replayed) < 2 or replayed[-1] == 0:
            raise UsageError(
                f"the {len(replayed)} requests of the trace that this run replays are all due at once: they have "
                "no rate to replay",
                hint="replay more of the trace (--num-requests, --duration), or use --concurrency",
            )

    @property
    def replayed(self) -> tuple[int, ...]:
        """The part of ``schedule_ns`` the run sends: the first ``num_requests``, or those due within
        ``duration_s``, or all."""
        if self.duration_s is not None:
            return tuple(due for due in self.schedule_ns if due <= self.duration_s * 1e9)
        return self.schedule_ns[: self.num_requests] if self.num_requests else self.schedule_ns

    def _check_find(self, find: str) -> None:
        if find not in FINDS:
            raise UsageError(f"--find {find!r} is not one of {', '.join(FINDS)}")
        if find == "max-concurrency" and self.open_loop:
            raise UsageError(
                "--find max-concurrency searches closed-loop levels",
                hint="leave out --request-rate, or pass --find max-rate",
            )
        if find == "max-rate" and not self.open_loop:
            raise UsageError(
                "--find max-rate searches open-loop levels from a first rate",
                hint="pass --request-rate START, e.g. --request-rate 1",
            )
        if len(self.values) > 1:
            flag = "--request-rate" if self.open_loop else "--concurrency"
            given = ",".join(f"{value:g}" for value in self.values)
            raise UsageError(f"--find starts from one {flag} value, got {given}", hint=f"pass {flag} START")

    @property
    def lowest_search_rate(self) -> float:
        """The lowest rate ``--find max-rate`` halves to: one whose level still has SYNTHETIC_MIN arrivals within
        ``duration_s`` (else within SEARCH_LEVEL_S): halving a failing start without this bound would end in
        levels that take hours to send their requests."""
        return SYNTHETIC_MIN / (self.duration_s or SEARCH_LEVEL_S)

    @property
    def values(self) -> tuple[float, ...]:
        """The levels asked for (with ``find``: the start): request rates (open loop; a trace's: its replayed
        requests' mean rate), else concurrencies."""
        if self.schedule_ns:
            replayed = self.replayed
            return ((len(replayed) - 1) / (replayed[-1] / 1e9),)
        return self.request_rates or self.concurrency

    @property
    def peak_concurrency(self) -> int:
        """The most slots a closed-loop level of the run has (the search's ceiling with ``find``); 0 in open loop."""
        if self.open_loop:
            return 0
        return int(self.concurrency[0] * 2**MAX_STEPS) if self.find else max(self.concurrency)

    @property
    def open_loop(self) -> bool:
        return bool(self.request_rates or self.schedule_ns)

    def warmup_of(self, value: float) -> int:
        """Warmup requests of the level at ``value``."""
        if self.warmup is not None:
            return self.warmup
        return 0 if self.open_loop else int(value)

    def share(self, rows: int | None) -> int:
        """The measured requests a level sends at least beside its floor: the rows left after the warmups divided
        among the levels (all the rows with ``reuse_rows``), or SYNTHETIC_MIN for synthetic inputs (``rows``
        None) and in a search."""
        if rows is None:
            return SYNTHETIC_MIN
        if self.reuse_rows:
            return rows
        if self.find:  # how many levels there will be is not known
            return SYNTHETIC_MIN
        return max(0, rows - sum(self.warmup_of(value) for value in self.values)) // len(self.values)

    def count_of(self, value: float, share: int, index: int) -> int:
        """Measured requests of level ``index`` at ``value``: ``num_requests``; for a duration, the arrivals due
        within it (open loop); else the larger of its floor (4 x the concurrency, 10 s of arrivals) and ``share``
        (in closed loop for a duration: the requests its slots cycle through). A searched level takes the largest
        of the floor, ``share`` and ``num_requests``: fewer requests than slots would not load it as its value says.
        A trace's level: the requests it replays."""
        if self.schedule_ns:
            return len(self.replayed)
        if self.open_loop and self.duration_s is not None:
            seed = arrival_seed(self.seed, index, warmup=False)
            return arrivals_within(self.duration_s, value, arrival=self.arrival, burstiness=self.burstiness, seed=seed)
        floor = math.ceil(10 * value) if self.open_loop else 4 * int(value)
        if self.find:  # a level of a search loads the server as its value says, whatever --num-requests
            return max(floor, share, self.num_requests or 0)
        return self.num_requests or max(floor, share)

    def levels(self, rows: int | None) -> list[Level]:
        """The levels asked for, over ``rows`` input rows (None: synthetic rows, as many as they take)."""
        return LevelPlan(self, rows).levels()


class LevelPlan:
    """Plans a run's levels one at a time, as the run reaches them: each level's requests and the input rows they
    take (see :class:`LoadSettings`).

    With ``rows`` input rows, a level that runs out of fresh rows wraps around to the first (the reused rows are
    counted in :attr:`Level.reused_rows`); with synthetic inputs (``rows`` None) every row index is a new row, made
    when the level is about to run.
    """

    def __init__(self, load: LoadSettings, rows: int | None) -> None:
        self.load = load
        self.rows = rows
        self.share = load.share(rows)
        self._next_index = 0
        self._cursor = 0
        self._used: set[int] = set()

    def _take(self, count: int) -> tuple[int, ...]:
        taken = tuple(self._cursor + j for j in range(count))
        self._cursor += count
        return taken if self.rows is None else tuple(row % self.rows for row in taken)

    def levels(self) -> list[Level]:
        """Every level the load asks for, planned now (a run without a search knows them all)."""
        return [self.level(value) for value in self.load.values]

    def level(self, value: float) -> Level:
        """The next level of the run, at ``value`` (a concurrency, or a request rate in open loop)."""
        load = self.load
        if load.reuse_rows:
            self._cursor = 0
        warmup_rows = self._take(load.warmup_of(value))
        self._used.update(warmup_rows)
        if load.reuse_rows:  # the measured requests, too, start at the first row
            self._cursor = 0
        measured = self._take(load.count_of(value, self.share, self._next_index))
        reused = 0
        for row in measured:
            reused += row in self._used
            self._used.add(row)
        kind = (
            {
                "request_rate": value,
                "arrival": "trace" if load.schedule_ns else load.arrival,
                "burstiness": load.burstiness,
                "max_concurrency": load.max_concurrency,
                "schedule_ns": load.replayed if load.schedule_ns else None,
            }
            if load.open_loop
            else {"concurrency": int(value)}
        )
        level = Level(self._next_index, measured, warmup_rows, reused_rows=reused, duration_s=load.duration_s, **kind)
        self._next_index += 1
        return level


@dataclass(frozen=True)
class Endpoint:
    """Where the load goes: ``HOST:PORT`` of Triton's gRPC or HTTP endpoint (or the base URL, ``http://HOST:PORT``,
    of an OpenAI-compatible server), the metrics URL (optional), and headers for the control calls (the key to a
    trtdeploy server's restricted APIs)."""

    url: str
    protocol: Transport = "grpc"
    metrics_url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class InputSpec:
    """Where input rows come from: a file (--input-data), a dataset, a trace (--trace), or synthetic inputs (the
    default)."""

    input_data: Path | None = None
    dataset: str | None = None
    split: str | None = None
    column: str | None = None
    reference_column: str | None = None
    isl: int | None = None
    osl: int | None = None
    #: Synthetic LLM inputs: each row's prompt and output length drawn from a normal distribution around
    #: ``isl``/``osl`` with these standard deviations (0: every row the same), rounded and clipped to 1..``caps``.
    isl_stddev: float = 0.0
    osl_stddev: float = 0.0
    #: Synthetic LLM inputs: every prompt starts with one of ``shared_prefixes`` prefixes of ``prefix_len`` tokens
    #: (row ``i`` with prefix ``i mod shared_prefixes``), followed by ``isl`` tokens of its own (0: no prefixes).
    shared_prefixes: int = 0
    prefix_len: int | None = None
    #: Input file or dataset: each row asks for as many tokens as its reference output has (the run counts them).
    osl_from_reference: bool = False
    #: A trace to replay: its requests' prompts and output lengths (their times are the load's ``schedule_ns``).
    trace: Trace | None = None
    #: The deployment's (max_input_len, max_output_len), which drawn lengths do not pass (set by the run).
    caps: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        sources = (("--input-data", self.input_data), ("--dataset", self.dataset), ("--trace", self.trace))
        given = [name for name, value in (*sources, ("--isl", self.isl)) if value is not None]
        if len(given) > 1:
            raise UsageError(f"{' and '.join(given)} are exclusive: choose one input")
        if self.trace is not None and self.osl is not None:
            raise UsageError("--trace gives each request's output length", hint="leave out --osl")
        if self.dataset is None and (self.split or self.column or self.reference_column):
            raise UsageError("--split, --column and --reference-column go with --dataset")
        for name, value in (("--isl", self.isl), ("--osl", self.osl)):
            if value is not None and value < 1:
                raise UsageError(f"{name} must be >= 1, got {value}")
        for name, value in (("--isl-stddev", self.isl_stddev), ("--osl-stddev", self.osl_stddev)):
            if not 0 <= value < math.inf:
                raise UsageError(f"{name} must be >= 0, got {value:g}")
        if (self.isl_stddev or self.osl_stddev) and not self.synthetic:
            raise UsageError("--isl-stddev and --osl-stddev vary synthetic prompts", hint="leave out the input data")
        if self.osl_stddev and self.osl is None:
            raise UsageError("--osl-stddev varies the output length around --osl", hint="pass --osl too")
        self._check_prefixes()
        if self.osl_from_reference and self.generated:
            raise UsageError(
                "--osl-from-reference takes the output lengths from the references of --input-data or --dataset",
                hint="pass one of them",
            )
        if self.osl_from_reference and self.osl is not None:
            raise UsageError("--osl-from-reference sets each request's output length", hint="leave out --osl")

    def _check_prefixes(self) -> None:
        if self.shared_prefixes < 0:
            raise UsageError(f"--shared-prefixes must be >= 0 (0: none), got {self.shared_prefixes}")
        if bool(self.shared_prefixes) != (self.prefix_len is not None):
            raise UsageError("--shared-prefixes N and --prefix-len P go together", hint="pass both, or neither")
        if self.prefix_len is not None and self.prefix_len < 1:
            raise UsageError(f"--prefix-len must be >= 1, got {self.prefix_len}")
        if self.shared_prefixes and not self.synthetic:
            raise UsageError("--shared-prefixes makes synthetic prompts", hint="leave out the input data or trace")
        if self.shared_prefixes and self.isl_stddev:
            raise UsageError("--isl-stddev varies plain synthetic prompts", hint="leave it out with --shared-prefixes")

    @property
    def synthetic(self) -> bool:
        """Synthetic prompts (``--isl``, ``--shared-prefixes``), made as the levels need them."""
        return self.input_data is None and self.dataset is None and self.trace is None

    @property
    def tokenizer_use(self) -> str | None:
        """What these inputs need an LLM's tokenizer for (None: nothing): prompts of exact token lengths, or output
        lengths counted from the references."""
        if self.trace is not None:
            return "a trace's prompts of exact token lengths"
        if self.synthetic:
            return "synthetic prompts of exactly --isl tokens"
        if self.osl_from_reference:
            return "counting the reference outputs' tokens (--osl-from-reference)"
        return None

    @property
    def generated(self) -> bool:
        """Whether the run makes its rows as the levels need them (:meth:`synthetic_rows`): synthetic or a
        trace's."""
        return self.input_data is None and self.dataset is None

    def describe(self, family: str = "llm") -> str:
        lengths = " (output lengths from the references)" if self.osl_from_reference else ""
        if self.input_data is not None:
            return f"{self.input_data}{lengths}"
        if self.dataset is not None:
            return self.dataset + (f" [{self.split}]" if self.split else "") + lengths
        if self.trace is not None:
            return self.trace.describe(self.caps)
        if family == "asr":
            return "synthetic speech (no reference transcripts: no WER/CER)"
        if family == "tts":
            return "synthetic voices and sentences"
        spread = f"±{self.isl_stddev:g}" if self.isl_stddev else ""
        outputs = f", osl={self.osl}±{self.osl_stddev:g}" if self.osl_stddev else ""
        prefixes = (
            f", {self.shared_prefixes} shared prefixes of {self.prefix_len} tokens before them"
            if self.shared_prefixes
            else ""
        )
        return f"synthetic isl={self.isl or DEFAULT_ISL}{spread}{outputs}{prefixes}"

    def load(self, workload: Workload) -> list[InputRow]:
        """The rows of the input file or dataset (synthetic rows are made as the levels need them:
        :meth:`synthetic_rows`)."""
        if self.input_data is not None:
            return workload.load_input_data(self.input_data)
        assert self.dataset is not None, "synthetic inputs have no rows to load"
        return workload.load_dataset(
            self.dataset, split=self.split, column=self.column, reference_column=self.reference_column
        )

    def synthetic_rows(self, workload: Workload, start: int, count: int, *, seed: int) -> list[InputRow]:
        """Rows ``start .. start + count - 1`` of a run seeded ``seed`` that makes its rows (:attr:`generated`): a
        trace's, or synthetic with their drawn lengths and shared prefixes."""
        caps = self.caps or (math.inf, math.inf)
        if self.trace is not None:
            return workload.layout_rows(self.trace.layouts(start, count, caps), seed=seed)
        isl = self.isl or DEFAULT_ISL
        osl = (
            _drawn(self.osl, self.osl_stddev, start, count, caps[1], (seed, LENGTH_STREAM, 1))
            if self.osl_stddev and self.osl is not None
            else self.osl
        )
        if self.shared_prefixes:
            assert self.prefix_len is not None
            outputs = osl if isinstance(osl, list) else [osl] * count
            layouts = [
                PromptLayout(
                    (((PREFIX_BLOCK, index % self.shared_prefixes), self.prefix_len), ((OWN_BLOCK, index), isl)),
                    self.prefix_len + isl,
                    max_tokens,
                    whole=1,
                )
                for index, max_tokens in enumerate(outputs, start=start)
            ]
            return workload.layout_rows(layouts, seed=seed)
        return workload.synthetic_rows(
            count,
            input_tokens=_drawn(isl, self.isl_stddev, start, count, caps[0], (seed, LENGTH_STREAM, 0))
            if self.isl_stddev
            else isl,
            output_tokens=osl,
            seed=seed,
            start=start,
        )


#: The random stream of drawn lengths (see :data:`~trtdeploy.perf.loadgen.ARRIVAL_STREAM`).
LENGTH_STREAM = ARRIVAL_STREAM + 1


def _drawn(mean: int, stddev: float, start: int, count: int, cap: float, seed: tuple[int, ...]) -> list[int]:
    """Lengths ``start .. start + count - 1`` of one stream drawn from a normal distribution, rounded and clipped
    to 1..``cap``."""
    import numpy as np

    values = np.random.default_rng(list(seed)).normal(mean, stddev, start + count)[start:]
    return np.clip(np.rint(values), 1, cap).astype(int).tolist()


@dataclass
class PerfRun:
    """The outcome of a run: the summary (``summary.json``), the records an observer kept, where reports went."""

    summary: dict[str, Any]
    records: list[Record] = field(default_factory=list)
    output_dir: Path | None = None

    def check_error_rate(self, max_error_rate: float) -> None:
        """Raise PerfError if a level's error rate exceeds ``max_error_rate``: any level's, or after ``--find`` the
        found level's only (the search runs levels past capacity on purpose, and their failed requests count as
        missing the SLO)."""
        levels = self.summary["levels"]
        search = self.summary.get("search")
        if search is not None:
            levels = [] if search["found"] is None else [levels[search["level"]]]
        for level in levels:
            if level["error_rate"] > max_error_rate:
                where = level_label(level["concurrency"], level["request_rate"])
                first = next(iter(level["error_messages"]), "")
                reports = f"; per-request errors in {self.output_dir / 'requests.jsonl'}" if self.output_dir else ""
                raise PerfError(
                    f"{level['errors']} of {level['requests']} requests failed at {where} "
                    f"(error rate {level['error_rate']:.1%} > --max-error-rate {max_error_rate:g})",
                    hint=f"first error: {first}{reports}",
                )


#: What a speech family's decoupled models stream, and the family's name, for the refusal of _choose_stream.
_SPEECH_STREAMS = {"tts": ("TTS", "audio"), "asr": ("ASR", "partial transcripts")}


def _choose_stream(
    requested: bool | None, model: ModelInfo, protocol: Transport, family: str, offline_model: str | None
) -> bool:
    """Whether requests stream: as the model is decoupled, refusing a ``requested`` mode it cannot serve, and a
    decoupled speech model over HTTP (Triton streams over HTTP through the generate extension only, whose JSON
    events carry LLM text and token ids, not audio) by name, before anything is sent. An OpenAI-compatible server
    streams unless told not to (its answers' first token is what most runs measure)."""
    if protocol == "openai":
        return True if requested is None else requested
    offline = ""
    if offline_model not in (None, model.name):
        offline = f"--model {offline_model}, which answers in one response"
    if model.decoupled and protocol != "grpc" and family in _SPEECH_STREAMS:
        kind, what = _SPEECH_STREAMS[family]
        raise UsageError(
            f"{model.name!r} is a streaming {kind} model (decoupled: it sends its {what} over a stream), and over "
            "HTTP Triton streams JSON text (generate_stream), not audio: --protocol http cannot load it",
            hint="pass --protocol grpc with the server's gRPC port" + (f", or {offline}" if offline else ""),
        )
    stream = model.decoupled if requested is None else requested
    if stream and not model.decoupled:
        raise UsageError(
            f"model {model.name!r} is not decoupled, so it cannot stream",
            hint="drop --stream, or benchmark a streaming deployment",
        )
    if not stream and model.decoupled:
        raise UsageError(
            f"model {model.name!r} is decoupled: it answers only over a stream",
            hint="drop --no-stream" + (f", or pass {offline}" if offline else ""),
        )
    return stream


class ServerWatch:
    """Probes the server's liveness while a phase runs; when it stops answering, the phase is given up.

    The server is lost when LOST_AFTER_PROBES probes in a row fail while no request succeeds (they fail, or hang):
    a server whose health endpoint alone falters while it keeps answering requests is not. Probes come every
    PROBE_INTERVAL_S, and sooner (PROBE_GAP_S apart) once requests fail: a dead server (refused connections) is
    seen within a second, a frozen one (no answer) within a few PROBE_TIMEOUT_S.
    """

    def __init__(self, control: ControlClient | OpenAIControl) -> None:
        self.control = control
        self.lost: str | None = None
        self._poke = asyncio.Event()
        self._watching = False
        self._errors = self._successes = 0

    def progress(self, done: int, errors: int) -> None:
        """The phase's progress: requests complete and failed so far. New failures bring the next probe forward."""
        if errors > self._errors:
            self._poke.set()
        self._errors, self._successes = errors, done - errors

    async def guard(self, driver: LocalDriver | WorkerPool, work: Awaitable[PhaseResult]) -> PhaseResult:
        """Await the phase ``work``; raise ServerLost after it if the server was lost meanwhile."""
        self.lost, self._watching = None, True
        self._errors = self._successes = 0
        watcher = asyncio.ensure_future(self._watch(driver))
        try:
            result = await work
        finally:
            self._watching = False
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if self.lost is not None:
            raise ServerLost(f"the server at {self.control.url} stopped answering: {self.lost}")
        return result

    async def _watch(self, driver: LocalDriver | WorkerPool) -> None:
        failures, successes = 0, 0  # failed probes in a row, and the requests that had succeeded at the first
        while self._watching:
            try:
                await within(self._poke.wait(), PROBE_INTERVAL_S)
            except asyncio.TimeoutError:
                pass
            self._poke.clear()
            try:
                live = await within(self.control.is_live(), PROBE_TIMEOUT_S)
                reason = "not live"
            except Exception as exc:
                live, reason = False, failure_reason(exc)
            if live:
                failures = 0
                continue
            if failures == 0 or self._successes != successes:  # requests still succeed: start counting again
                failures, successes = 0, self._successes
            failures += 1
            if failures >= LOST_AFTER_PROBES:
                self.lost = reason
                driver.abort(f"server lost: {reason}")
                return
            await asyncio.sleep(PROBE_GAP_S)


async def _snapshot(control: ControlClient | OpenAIControl, metrics_url: str | None) -> Snapshot | str:
    """The server's counters, or why they could not be read (they are extras: their failure costs no result)."""
    try:
        return await snapshot(control, metrics_url)
    except Exception as exc:
        return failure_reason(exc)


def _control_client(endpoint: Endpoint) -> ControlClient | OpenAIControl:
    """The control client of the server at ``endpoint``: Triton's for its protocol, or an OpenAI-compatible
    server's (the same calls)."""
    if endpoint.protocol == "openai":
        from .openai_api import OpenAIControl

        return OpenAIControl(endpoint.url)
    return ControlClient(endpoint.protocol, endpoint.url, headers=endpoint.headers)


async def run_levels(
    workload: Workload,
    rows: list[InputRow],
    endpoint: Endpoint,
    load: LoadSettings,
    *,
    options: RequestOptions | None = None,
    stream: bool | None = None,
    slo: Slo | None = None,
    progress: ProgressReporter | None = None,
    make_rows: Callable[[int, int], list[InputRow]] | None = None,
    observer: RunObserver | None = None,
    warn: Callable[[str], None] | None = None,
    offline_model: str | None = None,
) -> PerfRun:
    """Check the server and model, build the requests, then run each level: warmup, snapshot, load, snapshot.

    ``stream`` None streams exactly when the served model is decoupled; a decoupled speech model is refused over
    HTTP, the refusal naming ``offline_model``, the model that answers in one response beside it, if there is one.
    ``make_rows(start, count)``: synthetic rows ``start .. start + count - 1``, one per request, made (with their
    requests) as each level is about to run; ``rows`` is then empty. Records and level summaries go to
    ``observer`` as they exist (default: a :class:`RunCollector`, whose records the result holds). A level the
    server does not live through ends early and raises :class:`ServerLost`; Ctrl-C (cancellation) ends it as
    ``interrupted``; either way its summary reaches the observer first. ``warn`` gets a line for input rows reused
    without ``reuse_rows``.

    With ``load.find`` the levels are searched for (:class:`~trtdeploy.perf.search.Search`): each is planned once
    the one before it has told whether it met ``slo``, and the summary's ``search`` says what was found.
    """
    check_search(load.find, slo)
    progress = progress or _NoProgress()
    collector = RunCollector() if observer is None else None
    observer = observer or collector
    assert observer is not None
    control = _control_client(endpoint)
    try:
        await control.check_live()
        model = await control.model_info(workload.model_name)
        stream = _choose_stream(stream, model, endpoint.protocol, workload.family, offline_model)
        options = replace(options or RequestOptions(), stream=stream)
        if slo is not None:
            slo.check(workload.family, stream)
        workload.validate(model, options)
        if endpoint.protocol == "openai":  # what fields the server takes is known only by asking it
            from .openai_api import PROBE_ROW

            await control.check_request(workload.make_request(PROBE_ROW, options, model), timeout_s=load.timeout_s)
        requests = [workload.make_request(row, options, model) for row in rows]
        plan = LevelPlan(load, None if make_rows is not None else len(rows))
        search = Search(load.find, load.values[0], lowest_rate=load.lowest_search_rate) if load.find else None
        levels = plan.levels() if search is None else []
        reused = sum(level.reused_rows for level in levels)
        if reused and not load.reuse_rows and warn is not None:
            sent = sum(level.warmup + level.num_requests for level in levels)
            warn(
                f"the input has {len(rows)} rows for the {sent} requests of this run: {reused} measured requests "
                "reuse a row (input_rows_reused in the summary); give more rows or fewer --num-requests, or pass "
                "--reuse-rows to reuse them on purpose"
            )
        header = {
            "model": model.name,
            "workload": type(workload).__name__,
            "family": workload.family,
            "stream": stream,
            "protocol": endpoint.protocol,
            "url": endpoint.url,
            "input_rows": None if make_rows is not None else len(rows),
            "input_reuse": "repeat" if load.reuse_rows else "fresh",
            "arrival": {
                "process": "trace" if load.schedule_ns else load.arrival,
                "burstiness": load.burstiness,
                "max_concurrency": load.max_concurrency,
            }
            if load.open_loop
            else None,
            "options": asdict(options),
            "slo": slo.to_dict() if slo is not None else None,
            "find": load.find,
            "workers": load.workers,
        }
        observer.started(header)
        # connections a process needs: its share of the slots; 0 (no limit) in open loop
        slots = math.ceil(load.peak_concurrency / load.workers)
        spec = WorkerSpec(endpoint.protocol, endpoint.url, model.name, load.timeout_s, stream, slots)
        driver: LocalDriver | WorkerPool
        driver = (
            LocalDriver(spec, workload, requests)
            if load.workers == 1
            else WorkerPool(spec, workload, requests, load.workers)
        )
        summaries: list[dict[str, Any]] = []
        level_run = _LevelRun(driver, control, endpoint, workload.family, stream, slo, load.seed, progress, observer)

        async def run_level(level: Level) -> dict[str, Any]:
            """Make the synthetic rows that ``level`` takes and the run has not made yet, then run it."""
            needed = max(level.warmup_rows + level.rows, default=-1) + 1
            if make_rows is not None and needed > len(requests):
                made = make_rows(len(requests), needed - len(requests))
                more = [workload.make_request(row, options, model) for row in made]
                requests.extend(more)
                driver.add(more)
            summary = await level_run.run(level)
            summaries.append(summary)
            return summary

        try:
            await driver.start()
            for level in levels:
                await run_level(level)
            warned = False
            while search is not None and (value := search.next_value()) is not None:
                level = plan.level(value)
                if level.reused_rows and not load.reuse_rows and warn is not None and not warned:
                    warn(_search_reuse(len(rows), level))
                    warned = True
                search.record(value, bool((await run_level(level))["slo_met"]))
        finally:
            await driver.close()
    finally:
        await control.close()
    found = {"search": search.summary()} if search is not None else {}
    return PerfRun(
        summary={**header, **found, "status": "complete", "levels": summaries, "definitions": DEFINITIONS},
        records=collector.records if collector is not None else [],
    )


def _search_reuse(rows: int, level: Level) -> str:
    return (
        f"the input's {rows} rows do not last the search: {level.reused_rows} measured requests of {level.label} "
        "and maybe of later levels reuse a row (input_rows_reused in the summary); give more rows, or pass "
        "--reuse-rows to reuse them on purpose"
    )


@dataclass
class _LevelRun:
    """What every level of a run needs: where the load goes and how it is measured and reported."""

    driver: LocalDriver | WorkerPool
    control: ControlClient | OpenAIControl
    endpoint: Endpoint
    family: str
    stream: bool
    slo: Slo | None
    seed: int
    progress: ProgressReporter
    observer: RunObserver

    async def run(self, level: Level) -> dict[str, Any]:
        """One level: warmup, snapshot, measured load (gauges sampled), snapshot; its summary."""
        if level.index > 0:  # the first level follows the run's own check
            try:
                await self.control.check_live()
            except ServerError as exc:
                raise ServerLost(exc.message, hint=exc.hint) from None
        stats = LevelStats(level, stream=self.stream, family=self.family, slo=self.slo)
        watch = ServerWatch(self.control)
        offset, last = [0, 0], [0, 0]  # offset: the warmup's (done, errors), added to the measured phase's

        def sink(rec: Record) -> None:
            metrics = stats.metrics(rec)
            stats.add(rec, metrics)
            self.observer.record(rec, level, metrics)

        def progressed(done: int, errors: int) -> None:
            watch.progress(done, errors)
            last[:] = [done, errors]
            self.progress.update(offset[0] + done, offset[1] + errors)
            self.observer.flush()

        status, cpu_s = "failed", [0.0]
        before: Snapshot | str = "not taken"
        after: Snapshot | str = "not taken"
        gauges = GaugeSampler(self.endpoint.metrics_url)
        planned = level.planned
        self.progress.start_level(level.label, None if planned is None else level.warmup + planned)
        try:
            if level.warmup:
                await watch.guard(self.driver, self.driver.run_phase(level, self.seed, progressed, sink, warmup=True))
                offset[:] = last
                last[:] = [0, 0]
            await asyncio.sleep(STATS_SETTLE_S)
            before = await _snapshot(self.control, self.endpoint.metrics_url)
            gauges.start()
            try:
                phase = self.driver.run_phase(level, self.seed, progressed, sink, warmup=False)
                cpu_s = (await watch.guard(self.driver, phase)).cpu_s
            finally:
                await gauges.stop()
            await asyncio.sleep(STATS_SETTLE_S)
            after = await _snapshot(self.control, self.endpoint.metrics_url)
            status = "complete"
        except ServerLost:
            status = "server_lost"
            raise
        except asyncio.CancelledError:
            status = "interrupted"
            raise
        finally:
            self.progress.finish_level()
            summary = stats.summary(cpu_s, status)
            summary["planned_requests"] = level.planned
            if isinstance(before, Snapshot) and isinstance(after, Snapshot):
                summary["server"] = server_delta(before, after, gauges.summary())
            else:
                reason = after if isinstance(after, str) else before
                summary["server"] = {"models": {}, "metrics": None, "unavailable": reason}
            self.observer.level_done(summary)
        return summary
