"""One perf run: find the server, the deployment and its workload, load the inputs, run the levels, report."""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ..errors import PerfError, ServerError, UsageError
from .loadgen import Level, LocalDriver, Record, WorkerPool, WorkerSpec
from .metrics import DEFINITIONS, check_slo, summarize_level
from .stats import server_delta, snapshot
from .transports import ControlClient
from .transports import Protocol as Transport
from .workload import InputRow, ModelInfo, RequestOptions, Workload

#: Prompt length of the synthetic inputs used when no input is given.
DEFAULT_ISL = 128
#: The fewest measured requests per level with synthetic inputs (4 x concurrency above that).
SYNTHETIC_MIN = 16
#: Triton's default ports: with ``--url`` on one of the first two and no ``--metrics-url``, metrics are on the third.
DEFAULT_PORTS = ("8000", "8001", "8002")
#: Pause before a statistics snapshot: Triton counts a request when it releases it, just after its last response.
STATS_SETTLE_S = 0.05


class ProgressReporter(Protocol):
    def start_level(self, label: str, total: int) -> None: ...
    def update(self, done: int, errors: int) -> None: ...
    def finish_level(self) -> None: ...


class _NoProgress:
    def start_level(self, label: str, total: int) -> None: ...
    def update(self, done: int, errors: int) -> None: ...
    def finish_level(self) -> None: ...


@dataclass(frozen=True)
class LoadSettings:
    """The levels of a run and how they are driven.

    Requests per level (``num_requests`` None): closed loop max(input rows, 4 x concurrency), open loop
    max(input rows, 10 s of arrivals), where synthetic inputs count as SYNTHETIC_MIN rows. Warmup requests per
    level (``warmup`` None): one per slot (the concurrency) in closed loop, none in open loop.
    """

    concurrency: tuple[int, ...] = (1,)
    request_rates: tuple[float, ...] = ()
    num_requests: int | None = None
    warmup: int | None = None
    workers: int = 1
    timeout_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UsageError(f"--workers must be >= 1, got {self.workers}")
        if any(rate <= 0 for rate in self.request_rates):
            raise UsageError("--request-rate values must be > 0")
        if self.num_requests is not None and self.num_requests < 1:
            raise UsageError(f"--num-requests must be >= 1, got {self.num_requests}")
        if self.warmup is not None and self.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {self.warmup}")
        if self.timeout_s <= 0:
            raise UsageError(f"--timeout must be > 0, got {self.timeout_s:g}")

    def levels(self, rows: int, *, synthetic: bool = False) -> list[Level]:
        """The levels for ``rows`` input rows. Synthetic rows are made for the run (see :meth:`synthetic_rows`)
        and each request gets a prompt of its own, so that no prefix cache serves one request from another."""
        base = SYNTHETIC_MIN if synthetic else rows
        levels: list[Level] = []
        offset = 0
        for index, value in enumerate(self.request_rates or self.concurrency):
            if self.request_rates:
                num = self.num_requests or max(base, math.ceil(10 * value))
                level = Level(index, num, self.warmup or 0, request_rate=value, row_offset=offset)
            else:
                num = self.num_requests or max(base, 4 * int(value))
                warmup = int(value) if self.warmup is None else self.warmup
                level = Level(index, num, warmup, concurrency=int(value), row_offset=offset)
            levels.append(level)
            if synthetic:
                offset += level.warmup + level.num_requests
        return levels

    def synthetic_rows(self) -> int:
        """How many synthetic prompts a run needs: one per request of every level, warmups included."""
        return sum(level.warmup + level.num_requests for level in self.levels(0, synthetic=True))


@dataclass(frozen=True)
class Endpoint:
    """Where the load goes: ``HOST:PORT`` of the gRPC or HTTP endpoint, and the metrics URL (optional)."""

    url: str
    protocol: Transport = "grpc"
    metrics_url: str | None = None


@dataclass(frozen=True)
class InputSpec:
    """Where input rows come from: a jsonl file, a dataset, or synthetic prompts (the default)."""

    jsonl: Path | None = None
    dataset: str | None = None
    split: str | None = None
    column: str | None = None
    reference_column: str | None = None
    isl: int | None = None
    osl: int | None = None

    def __post_init__(self) -> None:
        given = [
            name
            for name, value in (("--input-data", self.jsonl), ("--dataset", self.dataset), ("--isl", self.isl))
            if value is not None
        ]
        if len(given) > 1:
            raise UsageError(f"{' and '.join(given)} are exclusive: choose one input")
        if self.dataset is None and (self.split or self.column or self.reference_column):
            raise UsageError("--split, --column and --reference-column go with --dataset")
        for name, value in (("--isl", self.isl), ("--osl", self.osl)):
            if value is not None and value < 1:
                raise UsageError(f"{name} must be >= 1, got {value}")

    @property
    def synthetic(self) -> bool:
        return self.jsonl is None and self.dataset is None

    def describe(self) -> str:
        if self.jsonl is not None:
            return str(self.jsonl)
        if self.dataset is not None:
            return self.dataset + (f" [{self.split}]" if self.split else "")
        return f"synthetic isl={self.isl or DEFAULT_ISL}"

    def load(self, workload: Workload, load: LoadSettings) -> list[InputRow]:
        from .inputs import load_dataset_rows, load_jsonl

        if self.jsonl is not None:
            return load_jsonl(self.jsonl)
        if self.dataset is not None:
            return load_dataset_rows(
                self.dataset, split=self.split, column=self.column, reference_column=self.reference_column
            )
        return workload.synthetic_rows(
            load.synthetic_rows(), input_tokens=self.isl or DEFAULT_ISL, output_tokens=self.osl, seed=load.seed
        )


@dataclass
class PerfRun:
    """The outcome of a run: the summary (``summary.json``), every request's record, where reports went."""

    summary: dict[str, Any]
    records: list[Record]
    output_dir: Path | None = None

    def check_error_rate(self, max_error_rate: float) -> None:
        """Raise PerfError if any level's error rate exceeds ``max_error_rate``."""
        for level in self.summary["levels"]:
            if level["error_rate"] > max_error_rate:
                rate = level["request_rate"]
                where = f"concurrency {level['concurrency']}" if rate is None else f"rate {rate:g}/s"
                first = next(iter(level["error_messages"]), "")
                reports = f"; per-request errors in {self.output_dir / 'requests.jsonl'}" if self.output_dir else ""
                raise PerfError(
                    f"{level['errors']} of {level['requests']} requests failed at {where} "
                    f"(error rate {level['error_rate']:.1%} > --max-error-rate {max_error_rate:g})",
                    hint=f"first error: {first}{reports}",
                )


@dataclass(frozen=True)
class PerfSettings:
    """Everything ``trtdeploy perf`` is asked: target, load, inputs, generation options, SLOs, reports."""

    deployment: Path | None = None
    url: str | None = None
    protocol: Transport = "grpc"
    metrics_url: str | None = None
    model: str | None = None
    stream: bool | None = None
    load: LoadSettings = field(default_factory=LoadSettings)
    inputs: InputSpec = field(default_factory=InputSpec)
    options: RequestOptions = field(default_factory=RequestOptions)
    slo: dict[str, float] = field(default_factory=dict)
    output_dir: Path | None = None
    plots: bool = True


def _choose_stream(requested: bool | None, model: ModelInfo, protocol: Transport) -> bool:
    stream = model.decoupled if requested is None else requested
    if stream and not model.decoupled:
        raise UsageError(
            f"model {model.name!r} is not decoupled, so it cannot stream",
            hint="drop --stream, or benchmark a streaming deployment",
        )
    if not stream and model.decoupled:
        raise UsageError(f"model {model.name!r} is decoupled: it answers only over a stream", hint="drop --no-stream")
    if stream and protocol != "grpc":
        raise UsageError("streaming needs --protocol grpc", hint="tritonclient's HTTP client does not stream")
    return stream


async def run_levels(
    workload: Workload,
    rows: list[InputRow],
    endpoint: Endpoint,
    load: LoadSettings,
    *,
    options: RequestOptions | None = None,
    stream: bool | None = None,
    slo: dict[str, float] | None = None,
    progress: ProgressReporter | None = None,
    synthetic: bool = False,
) -> PerfRun:
    """Check the server and model, build every request, then run each level: warmup, snapshot, load, snapshot.

    ``stream`` None streams exactly when the served model is decoupled. ``synthetic``: the rows were made for
    this run (:meth:`LoadSettings.synthetic_rows` of them), one per request.
    """
    progress = progress or _NoProgress()
    slo = dict(slo or {})
    control = ControlClient(endpoint.protocol, endpoint.url)
    try:
        await control.check_live()
        model = await control.model_info(workload.model_name)
        stream = _choose_stream(stream, model, endpoint.protocol)
        options = replace(options or RequestOptions(), stream=stream)
        check_slo(slo, workload.family, stream)
        workload.validate(model, options)
        requests = [workload.make_request(row, options, model) for row in rows]
        levels = load.levels(len(rows), synthetic=synthetic)
        # connections a process needs: its share of the slots; 0 (no limit) in open loop
        slots = max(math.ceil((level.concurrency or 0) / load.workers) for level in levels)
        spec = WorkerSpec(endpoint.protocol, endpoint.url, model.name, load.timeout_s, stream, slots)
        driver: LocalDriver | WorkerPool
        driver = (
            LocalDriver(spec, workload, requests)
            if load.workers == 1
            else WorkerPool(spec, workload, requests, load.workers)
        )
        summaries: list[dict[str, Any]] = []
        records: list[Record] = []
        try:
            await driver.start()
            for level in levels:
                progress.start_level(level.label, level.warmup + level.num_requests)
                phase = partial(driver.run_phase, level, len(rows), load.seed)
                warm = (await phase(progress.update, warmup=True)).records if level.warmup else []
                base, base_errors = len(warm), sum(rec.error is not None for rec in warm)
                await asyncio.sleep(STATS_SETTLE_S)
                before = await snapshot(control, endpoint.metrics_url)
                measured = await phase(
                    lambda d, e, b=base, be=base_errors: progress.update(b + d, be + e), warmup=False
                )
                await asyncio.sleep(STATS_SETTLE_S)
                after = await snapshot(control, endpoint.metrics_url)
                progress.finish_level()
                summary = summarize_level(
                    warm + measured.records,
                    level,
                    stream=stream,
                    family=workload.family,
                    slo=slo,
                    client_cpu_s=measured.cpu_s,
                )
                summary["server"] = server_delta(before, after)
                summaries.append(summary)
                records.extend(warm + measured.records)
        finally:
            await driver.close()
    finally:
        await control.close()
    return PerfRun(
        summary={
            "model": model.name,
            "workload": type(workload).__name__,
            "family": workload.family,
            "stream": stream,
            "protocol": endpoint.protocol,
            "url": endpoint.url,
            "input_rows": len(rows),
            "options": asdict(options),
            "slo": slo,
            "workers": load.workers,
            "levels": summaries,
            "definitions": DEFINITIONS,
        },
        records=records,
    )


def resolve_endpoint(url: str | None, protocol: Transport, metrics_url: str | None) -> tuple[Endpoint, Path | None]:
    """The endpoint and the deployment of the server ``trtdeploy serve`` started (the one at ``url``, else the
    latest); a ``url`` no such server answers on is taken as given, for the chosen protocol."""
    from ..server import current_server

    info = current_server(url)
    if info.state_file is not None:
        server_url = info.grpc_url if protocol == "grpc" else info.http_url
        if server_url is None:
            raise ServerError(f"the server at {url or info.grpc_url} has no {protocol} endpoint")
        return Endpoint(server_url, protocol, metrics_url or info.metrics_url), info.deployment
    assert url is not None
    url = url.split("://", 1)[-1].rstrip("/")
    host, _, port = url.rpartition(":")
    if metrics_url is None and port in DEFAULT_PORTS[:2]:
        metrics_url = f"http://{host}:{DEFAULT_PORTS[2]}/metrics"
    return Endpoint(url, protocol, metrics_url), None


def resolve_workload(deployment: Any, model: str | None) -> Workload:
    """The deployment's workload (from its model plugin), aimed at ``model`` when given.

    The deployment's LLM-contract model (``tensorrt_llm``) gets a :class:`TokenLLMWorkload` instead.
    """
    if model is not None and model == deployment.llm_model_name and model != deployment.entry_model:
        from .llm import TokenLLMWorkload

        return TokenLLMWorkload(model, deployment.llm_dir, decoupled=deployment.decoupled)
    from ..plugins import get_model

    workload = get_model(deployment.model).workload(deployment)
    return workload.retarget(model) if model is not None and model != workload.model_name else workload


def default_output_dir(model: str) -> Path:
    return Path("perf-results") / f"{model}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def benchmark(settings: PerfSettings, *, progress: ProgressReporter | None = None) -> PerfRun:
    """Run ``trtdeploy perf``: resolve the target, load the inputs, run every level, write the reports."""
    from ..deployment import Deployment, find_latest
    from .report import write_reports

    endpoint, server_deployment = resolve_endpoint(settings.url, settings.protocol, settings.metrics_url)
    path = settings.deployment or server_deployment
    deployment = Deployment.load(path) if path is not None else find_latest()
    workload = resolve_workload(deployment, settings.model)
    rows = settings.inputs.load(workload, settings.load)
    started = datetime.now().astimezone()
    run = asyncio.run(
        run_levels(
            workload,
            rows,
            endpoint,
            settings.load,
            options=settings.options,
            stream=settings.stream,
            slo=settings.slo,
            progress=progress,
            synthetic=settings.inputs.synthetic,
        )
    )
    run.summary = {
        "started_at": started.isoformat(timespec="seconds"),
        "deployment": str(deployment.path),
        "input": settings.inputs.describe(),
        **run.summary,
    }
    run.output_dir = settings.output_dir or default_output_dir(run.summary["model"])
    write_reports(run, run.output_dir, plots=settings.plots)
    return run
