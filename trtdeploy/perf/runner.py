"""One perf run: find the server, the deployment and its workload, load the inputs, run the levels, report."""

from __future__ import annotations

import asyncio
import math
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import PerfError, ServerError, TrtDeployError, UsageError
from .loadgen import Level, LocalDriver, Record, WorkerPool, WorkerSpec
from .metrics import DEFINITIONS, check_slo, check_slo_limits, summarize_level
from .stats import server_delta, snapshot
from .transports import ControlClient
from .transports import Protocol as Transport
from .workload import InputRow, ModelInfo, RequestOptions, Workload

if TYPE_CHECKING:
    from ..deployment import Deployment
    from ..server import ServerInfo

#: Prompt length of the synthetic inputs used when no input is given (at most the deployment's max_input_len).
DEFAULT_ISL = 128
#: Output length when neither the run nor an input row gives one (at most the deployment's max_output_len), for
#: LLM workloads that do not set one of their own.
DEFAULT_OSL = 128
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
        bad = [rate for rate in self.request_rates if not (0 < rate < math.inf)]
        if bad:
            raise UsageError(f"--request-rate values must be > 0, got {bad[0]:g}", hint="e.g. --request-rate 5,10")
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
    """Where input rows come from: a file (--input-data), a dataset, or synthetic inputs (the default)."""

    input_data: Path | None = None
    dataset: str | None = None
    split: str | None = None
    column: str | None = None
    reference_column: str | None = None
    isl: int | None = None
    osl: int | None = None

    def __post_init__(self) -> None:
        given = [
            name
            for name, value in (("--input-data", self.input_data), ("--dataset", self.dataset), ("--isl", self.isl))
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
        return self.input_data is None and self.dataset is None

    def describe(self, family: str = "llm") -> str:
        if self.input_data is not None:
            return str(self.input_data)
        if self.dataset is not None:
            return self.dataset + (f" [{self.split}]" if self.split else "")
        return "synthetic voices and sentences" if family == "tts" else f"synthetic isl={self.isl or DEFAULT_ISL}"

    def load(self, workload: Workload, load: LoadSettings) -> list[InputRow]:
        if self.input_data is not None:
            return workload.load_input_data(self.input_data)
        if self.dataset is not None:
            return workload.load_dataset(
                self.dataset, split=self.split, column=self.column, reference_column=self.reference_column
            )
        return workload.synthetic_rows(
            load.synthetic_rows(), input_tokens=self.isl or DEFAULT_ISL, output_tokens=self.osl, seed=load.seed
        )


@dataclass(frozen=True)
class AsrSettings:
    """Where generated speech is transcribed for WER/CER (``--asr-url``): a Whisper model on Triton (gRPC)."""

    url: str
    model: str = "whisper_bls"
    #: ``en``, ``zh``, or None to tell each utterance's language from its text.
    language: str | None = None
    concurrency: int = 4


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
    asr: AsrSettings | None = None

    def __post_init__(self) -> None:
        if self.url is not None:
            check_url(self.url)
        check_slo_limits(self.slo)


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


def check_url(
    url: str,
    *,
    flag: str = "--url",
    schemes: tuple[str, ...] = ("grpc", "http", "https"),
    example: str = "e.g. --url localhost:8001 (gRPC), or --url localhost:8000 --protocol http",
) -> str:
    """``HOST:PORT`` of ``url`` (``SCHEME://HOST:PORT[/]`` is accepted too, for one of ``schemes``); UsageError
    naming the option ``flag`` if it is not one."""
    scheme, sep, rest = url.strip().partition("://")
    address = (rest if sep else scheme).rstrip("/")
    host, _, port = address.rpartition(":")
    if (sep and scheme not in schemes) or not host or "/" in address or not port.isdigit():
        raise UsageError(f"{flag} {url!r} is not HOST:PORT", hint=example)
    if not 0 < int(port) < 65536:
        raise UsageError(f"{flag} {url!r}: port {port} is not between 1 and 65535")
    return address


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def server_of(deployment: Path) -> ServerInfo:
    """The most recently started running server (its :class:`~trtdeploy.server.ServerInfo`) that serves
    ``deployment``; ServerError naming the deployment if none does."""
    from ..server import running_servers

    servers = running_servers()
    for info in servers:
        if info.deployment is not None and _same_path(Path(info.deployment), deployment):
            return info
    others = "; ".join(f"{info.grpc_url} serves {info.deployment}" for info in servers)
    raise ServerError(
        f"no running server serves {deployment}",
        hint=f"start one with `trtdeploy serve {deployment} --background`, or pass --url HOST:PORT"
        + (f" (running: {others})" if others else ""),
    )


def resolve_endpoint(
    url: str | None, protocol: Transport, metrics_url: str | None, *, deployment: Path | None = None
) -> tuple[Endpoint, Path | None]:
    """The endpoint and the deployment of the server to load.

    With ``url``: the server ``trtdeploy serve`` started there, or else ``url`` as given, for the chosen protocol.
    Without: the running server that serves ``deployment`` (ServerError if none does), or with no deployment
    either, the most recently started one.
    """
    from ..server import current_server

    if url is not None:
        check_url(url)
        info = current_server(url)
    elif deployment is not None:
        info = server_of(deployment)
    else:
        info = current_server()
    if info.state_file is not None:
        server_url = info.grpc_url if protocol == "grpc" else info.http_url
        if server_url is None:
            raise ServerError(f"the server at {url or info.grpc_url} has no {protocol} endpoint")
        return Endpoint(server_url, protocol, metrics_url or info.metrics_url), info.deployment
    assert url is not None
    url = check_url(url)
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


def prepare_output_dir(path: Path) -> list[Path]:
    """Create the reports folder ``path`` and check that files can be written there, or raise UsageError.

    Returns the folders created (the deepest first), to remove again if the run fails before writing anything.
    """
    created = []
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            break
        created.append(folder)
    hint = "pass --output-dir DIR, a folder you can write to"
    if path.exists() and not path.is_dir():
        raise UsageError(f"cannot write reports to {path}: it is a file, not a folder", hint=hint)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        remove_empty(created)
        raise UsageError(f"cannot write reports to {path}: {exc.strerror or exc}", hint=hint) from None
    return created


def remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (in order) that is empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def apply_limits(settings: PerfSettings, deployment: Deployment, workload: Workload) -> PerfSettings:
    """``settings`` with the default lengths fitted to the deployment's limits (``max_input_len``,
    ``max_output_len`` of its build), after refusing explicit lengths beyond them.

    Default prompt length of synthetic inputs: min(DEFAULT_ISL, max_input_len). Default output length of an LLM
    workload: ``--osl`` of the synthetic inputs if given, else min(the workload's own default, else DEFAULT_OSL,
    max_output_len).
    """
    point = deployment.point
    max_in, max_out = int(point.max_input_len), int(point.max_output_len)
    inputs, options = settings.inputs, settings.options
    if inputs.isl is not None and inputs.isl > max_in:
        raise UsageError(
            f"--isl {inputs.isl} is more than this deployment's max_input_len {max_in}",
            hint=f"pass --isl {max_in} or less, or build the deployment with a larger --max-input-len",
        )
    for osl in sorted({inputs.osl, options.max_tokens} - {None}):
        if osl > max_out:
            raise UsageError(
                f"--osl {osl} is more than this deployment's max_output_len {max_out}",
                hint=f"pass --osl {max_out} or less, or build the deployment with a larger --max-output-len",
            )
    if inputs.synthetic and inputs.isl is None:
        inputs = replace(inputs, isl=min(DEFAULT_ISL, max_in))
    if workload.family == "llm" and options.max_tokens is None:
        own = getattr(workload, "max_tokens", None)
        default = min(own if isinstance(own, int) else DEFAULT_OSL, max_out)
        options = replace(options, max_tokens=inputs.osl or default)
    return replace(settings, inputs=inputs, options=options)


def check_row_lengths(rows: list[InputRow], deployment: Deployment) -> None:
    """Refuse input rows that ask for more output tokens than the deployment's max_output_len."""
    max_out = int(deployment.point.max_output_len)
    for number, row in enumerate(rows, start=1):
        if row.max_tokens is not None and row.max_tokens > max_out:
            raise UsageError(
                f"input row {number} asks for max_tokens {row.max_tokens}, more than this deployment's "
                f"max_output_len {max_out}",
                hint=f"keep max_tokens <= {max_out} in the input data",
            )


def resolve_target(settings: PerfSettings, warn: Callable[[str], None]) -> tuple[Endpoint, Deployment]:
    """The endpoint to load and the deployment it serves (see :func:`resolve_endpoint`)."""
    from ..deployment import Deployment, find_latest

    if settings.deployment is not None:
        deployment = Deployment.load(settings.deployment)
        endpoint, served = resolve_endpoint(
            settings.url, settings.protocol, settings.metrics_url, deployment=deployment.path
        )
        if served is not None and not _same_path(served, deployment.path):
            warn(f"the server at {endpoint.url} serves {served}, not {deployment.path}; loading it as the latter")
        return endpoint, deployment
    endpoint, served = resolve_endpoint(settings.url, settings.protocol, settings.metrics_url)
    return endpoint, Deployment.load(served) if served is not None else find_latest()


async def score_speech(run: PerfRun, asr: AsrSettings) -> None:
    """Transcribe the kept audio of every level (one request per input row) and score it against the target
    text: ``wer``/``cer`` in each record's scores, the transcript as its text, and each level's ``asr`` summary."""
    from . import asr as speech
    from .tts import resample

    scored = [rec for rec in run.records if rec.audio is not None and rec.reference is not None]
    languages = [asr.language or speech.detect_language(str(rec.reference)) for rec in scored]
    wavs = [resample(rec.audio, rec.sample_rate, speech.SAMPLE_RATE) for rec in scored]
    texts = await speech.transcribe(asr.url, wavs, languages, model=asr.model, concurrency=asr.concurrency)
    by_level: dict[int, list[Any]] = {}
    for rec, text, language in zip(scored, texts, languages, strict=True):
        result = speech.score(text, str(rec.reference), language)
        rec.text = text
        rec.scores.update(wer=result.wer, cer=result.cer)
        by_level.setdefault(rec.level, []).append(result)
    for level in run.summary["levels"]:
        level["asr"] = speech.aggregate(by_level.get(level["level"], []))
    run.summary["asr"] = {"url": asr.url, "model": asr.model, "language": asr.language or "auto"}
    run.summary["definitions"] = {**run.summary["definitions"], "asr": speech.DEFINITION}


def benchmark(
    settings: PerfSettings,
    *,
    progress: ProgressReporter | None = None,
    warn: Callable[[str], None] | None = None,
) -> PerfRun:
    """Run ``trtdeploy perf``: resolve the target, check the reports folder, load the inputs, run every level,
    write the reports. ``warn`` gets one line per problem that does not stop the run (default: stderr)."""
    from .report import warn_on_stderr, write_reports

    warn = warn or warn_on_stderr
    endpoint, deployment = resolve_target(settings, warn)
    workload = resolve_workload(deployment, settings.model)
    if workload.family == "tts":
        if settings.inputs.isl is not None:
            raise UsageError("--isl sets the prompt length of LLM workloads; speech inputs have no token length")
    elif settings.asr is not None:
        raise UsageError(f"--asr-url scores speech; {workload.model_name!r} is not a TTS model")
    if settings.asr is not None:
        from .asr import check_whisper

        asyncio.run(check_whisper(settings.asr.url, settings.asr.model))
    settings = apply_limits(settings, deployment, workload)
    output_dir = settings.output_dir or default_output_dir(workload.model_name)
    created = prepare_output_dir(output_dir)  # before the load: a run is not lost for want of a folder
    measured = False
    try:
        rows = settings.inputs.load(workload, settings.load)
        check_row_lengths(rows, deployment)
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
            "input": settings.inputs.describe(workload.family),
            **run.summary,
        }
        run.output_dir = output_dir
        measured = True
        asr_error = None
        if settings.asr is not None:
            try:
                asyncio.run(score_speech(run, settings.asr))
            except TrtDeployError as exc:  # the measurements stay: write them, then fail
                asr_error = exc
                warn(f"no WER/CER ({exc.message}); the other reports are written to {output_dir}")
        write_reports(run, output_dir, plots=settings.plots, warn=warn)
        if asr_error is not None:
            raise asr_error
    finally:
        if not measured:  # nothing to report: leave no empty folder behind
            remove_empty(created)
    return run
