"""One ``trtdeploy perf`` run: find the server, the deployment and its workload, fit the lengths to the deployment's
limits, prepare the reports folder, drive the perf engine (:mod:`trtdeploy.perf`) and keep whatever it measured.

The engine writes every record and every level summary as they exist; this module decides how a run ends: the
server lost (exit 5) or Ctrl-C (exit 130) still leave complete files for what was measured, marked as such.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .deployment import Deployment
from .errors import Interrupted, ServerError, TrtDeployError, UsageError
from .fsutil import prepare_output_dir, remove_empty
from .perf.asr import WHISPER_MODEL, AsrSettings, check_whisper, score_reports
from .perf.control import check_url
from .perf.loadgen import level_label
from .perf.report import ReportWriter, default_output_dir, warn_on_stderr
from .perf.runner import (
    DEFAULT_ISL,
    Endpoint,
    InputSpec,
    LoadSettings,
    PerfRun,
    ProgressReporter,
    ServerLost,
    run_levels,
)
from .perf.search import check_search
from .perf.slo import Slo
from .perf.workload import InputRow, RequestOptions, Workload, check_workload
from .remote import RemoteTarget, resolve_remote
from .server import DEFAULT_PORTS, resolved_path

if TYPE_CHECKING:
    from .perf.control import Protocol
    from .perf.openai_api import Api, OpenAIWorkload
    from .server import ServerInfo

#: Output length when neither the run nor an input row gives one (at most the deployment's max_output_len), for
#: LLM workloads that do not set one of their own.
DEFAULT_OSL = 128


@dataclass(frozen=True)
class PerfSettings:
    """Everything ``trtdeploy perf`` is asked: target, load, inputs, generation options, SLOs, reports.

    ``endpoint`` ``openai``: the target is the OpenAI-compatible server at ``url``, loaded through its ``api``
    (``completions`` by default), its tokens counted with ``tokenizer``, every request's body completed with
    ``extra_body``; ``protocol`` and ``deployment`` are Triton's. ``tokenizer`` is also the LLM's of a Triton
    without a deployment folder here (a folder or a Hub name).
    """

    deployment: Path | None = None
    url: str | None = None
    protocol: Protocol = "grpc"
    endpoint: Literal["triton", "openai"] = "triton"
    api: Api | None = None
    tokenizer: str | None = None
    extra_body: Mapping[str, Any] | None = None
    metrics_url: str | None = None
    model: str | None = None
    stream: bool | None = None
    load: LoadSettings = field(default_factory=LoadSettings)
    inputs: InputSpec = field(default_factory=InputSpec)
    options: RequestOptions = field(default_factory=RequestOptions)
    slo: Slo | None = None
    output_dir: Path | None = None
    plots: bool = True
    asr: AsrSettings | None = None
    #: A Triton without a deployment folder here: the workload to load it with (default: the one that recognizes
    #: the model's configuration); ``tokenizer`` is its LLM's too.
    workload: str | None = None

    def __post_init__(self) -> None:
        if self.endpoint == "openai":
            self._check_openai()
        elif self.url is not None:
            check_url(self.url)
        if self.endpoint == "triton":
            given = ["--api"] if self.api is not None else []
            given += ["--extra-body"] if self.extra_body is not None else []
            if given:
                raise UsageError(
                    f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --endpoint openai",
                    hint="pass --endpoint openai --url URL to load an OpenAI-compatible server",
                )
        check_search(self.load.find, self.slo)

    def _check_openai(self) -> None:
        from .perf.openai_api import API_PATHS, base_url

        if self.url is None:
            raise UsageError("--endpoint openai needs the server's --url", hint="e.g. --url http://localhost:8000")
        base_url(self.url)
        if self.deployment is not None:
            raise UsageError(
                f"{self.deployment} is a deployment folder, which Triton serves; --endpoint openai loads --url",
                hint="leave out the deployment folder, or --endpoint openai",
            )
        if self.api is not None and self.api not in API_PATHS:
            raise UsageError(f"--api {self.api!r} is not one of {', '.join(API_PATHS)}")
        if self.asr is not None:
            raise UsageError("--asr scores speech from a TTS model; --endpoint openai loads a text LLM")
        if self.workload is not None:
            raise UsageError(
                "--workload tells how to load a Triton model; --endpoint openai loads a text LLM",
                hint="leave out --workload, or --endpoint openai for a Triton --url",
            )


def server_of(deployment: Path) -> ServerInfo:
    """The running server (its :class:`~trtdeploy.server.ServerInfo`) that serves ``deployment``; ServerError
    naming the deployment if none does."""
    from .server import listing, running_servers, servers_of

    serving = servers_of(deployment)
    if serving:
        return serving[0]
    others = listing(running_servers())
    raise ServerError(
        f"no running server serves {deployment}",
        hint=f"start one with `trtdeploy serve {deployment} --background`, or pass --url HOST:PORT"
        + (f" (running: {others})" if others else ""),
    )


def endpoint_of(info: ServerInfo, protocol: Protocol, metrics_url: str | None) -> Endpoint:
    """The endpoint of a server trtdeploy started, for ``protocol``, with the key to its restricted APIs."""
    server_url = info.grpc_url if protocol == "grpc" else info.http_url
    if server_url is None:
        raise ServerError(f"the server at {info.grpc_url or info.http_url} has no {protocol} endpoint")
    return Endpoint(server_url, protocol, metrics_url or info.metrics_url, info.restricted_headers(protocol))


def resolve_endpoint(
    url: str | None, protocol: Protocol, metrics_url: str | None, *, deployment: Path | None = None
) -> tuple[Endpoint, Path | None]:
    """The endpoint and the deployment of the server to load.

    With ``url``: the server ``trtdeploy serve`` started there, or else ``url`` as given, for the chosen protocol.
    Without: the running server that serves ``deployment`` (ServerError if none does), or with no deployment
    either, the server of the deployment under the current folder (refusing to guess among several).
    """
    from .server import choose_server, current_server

    address = check_url(url) if url is not None else None
    if address is not None:
        info = current_server(address)
    elif deployment is not None:
        info = server_of(deployment)
    else:
        info = choose_server()
    if info.state_file is not None:
        return endpoint_of(info, protocol, metrics_url), info.deployment
    assert address is not None
    host, _, port = address.rpartition(":")
    if metrics_url is None and int(port) in DEFAULT_PORTS[:2]:  # Triton's defaults: metrics are on the third
        metrics_url = f"http://{host}:{DEFAULT_PORTS[2]}/metrics"
    return Endpoint(address, protocol, metrics_url), None


def resolve_workload(deployment: Deployment, model: str | None) -> Workload:
    """The deployment's workload (from its model plugin), aimed at ``model`` when given.

    The deployment's LLM-contract model (``tensorrt_llm``) gets a :class:`TokenLLMWorkload` instead.
    """
    if model is not None and model == deployment.llm_model_name and model != deployment.entry_model:
        from .perf.llm import TokenLLMWorkload

        return TokenLLMWorkload(model, deployment.llm_dir, decoupled=deployment.decoupled)
    from .plugins import get_model

    workload = check_workload(get_model(deployment.model).workload(deployment), deployment.model)
    return workload.retarget(model) if model is not None and model != workload.model_name else workload


def deployment_workload(settings: PerfSettings, deployment: Deployment) -> tuple[Workload, str | None]:
    """The workload of a deployment's server (:func:`resolve_workload`), and the deployment's model that answers
    in one response what its entry model streams, when that is the model loaded (a refusal to stream over HTTP
    names it)."""
    from .plugins import get_model

    given = [flag for flag, value in (("--workload", settings.workload), ("--tokenizer", settings.tokenizer)) if value]
    if given:
        raise UsageError(
            f"{' and '.join(given)} tell how to load a server with no deployment folder here; {deployment.path} "
            "is this server's, and its model plugin knows its workload and tokenizer",
            hint=f"leave {' and '.join(given)} out",
        )
    workload = resolve_workload(deployment, settings.model)
    offline = None
    if workload.model_name == deployment.entry_model:
        offline = get_model(deployment.model).offline_model(deployment.point.mode)
    return workload, offline


def apply_limits(settings: PerfSettings, deployment: Deployment | None, workload: Workload) -> PerfSettings:
    """``settings`` with the default lengths fitted to the deployment's limits (``max_input_len``,
    ``max_output_len`` of its build), after refusing explicit lengths beyond them; without a deployment (a remote
    Triton or an OpenAI-compatible server, whose limits are not known) the lengths are used as given and the
    defaults as they are.

    Default prompt length of synthetic inputs: min(DEFAULT_ISL, max_input_len) (less a shared prefix's length).
    Default output length of an LLM workload: ``--osl`` of the synthetic inputs if given, else min(the workload's
    own default, else DEFAULT_OSL, max_output_len). A trace's lengths are clipped to the limits instead (see
    :meth:`~trtdeploy.perf.trace.Trace.layouts`).
    """
    inputs, options = settings.inputs, settings.options
    max_in: float = math.inf  # a remote server's limits: not known
    max_out: float = math.inf
    if deployment is not None:
        max_in, max_out = int(deployment.point.max_input_len), int(deployment.point.max_output_len)
    prefix = inputs.prefix_len or 0
    if prefix >= max_in:
        raise UsageError(
            f"--prefix-len {prefix} leaves no room for a prompt's own tokens in this deployment's max_input_len "
            f"{max_in}",
            hint=f"pass --prefix-len {max_in - 1} or less",
        )
    if inputs.isl is not None and inputs.isl + prefix > max_in:
        shared = f" after a --prefix-len {prefix}" if prefix else ""
        raise UsageError(
            f"--isl {inputs.isl}{shared} is more than this deployment's max_input_len {max_in}",
            hint=f"pass --isl {max_in - prefix} or less, or build the deployment with a larger --max-input-len",
        )
    for osl in sorted({inputs.osl, options.max_tokens} - {None}):
        if osl > max_out:
            raise UsageError(
                f"--osl {osl} is more than this deployment's max_output_len {max_out}",
                hint=f"pass --osl {max_out} or less, or build the deployment with a larger --max-output-len",
            )
    if inputs.synthetic and inputs.isl is None:
        inputs = replace(inputs, isl=min(DEFAULT_ISL, max_in - prefix))
    inputs = replace(inputs, caps=None if deployment is None else (max_in, max_out))
    if workload.family == "llm" and options.max_tokens is None:
        default = min(workload.max_tokens or DEFAULT_OSL, max_out)
        options = replace(options, max_tokens=inputs.osl or default)
    return replace(settings, inputs=inputs, options=options)


def lengths_from_references(
    rows: list[InputRow], workload: Workload, deployment: Deployment | None, warn: Callable[[str], None]
) -> list[InputRow]:
    """``rows`` asking each for as many tokens as its reference output has (``--osl-from-reference``), counted
    with the workload's tokenizer: at least one, at most the deployment's max_output_len when there is a
    deployment (``warn`` says how many references are longer)."""
    max_out = int(deployment.point.max_output_len) if deployment is not None else None
    fitted, longer = [], 0
    for number, row in enumerate(rows, start=1):
        if not isinstance(row.reference, str):
            raise UsageError(
                f"input row {number} has no reference output to take its output length from",
                hint='give every row one (an "output" in --input-data, --reference-column of --dataset), or '
                "leave out --osl-from-reference",
            )
        tokens = max(workload.count_text_tokens(row.reference), 1)
        if max_out is not None and tokens > max_out:
            longer, tokens = longer + 1, max_out
        fitted.append(replace(row, max_tokens=tokens))
    if longer:
        warn(
            f"{longer} of the {len(rows)} reference outputs are longer than this deployment's max_output_len "
            f"{max_out}: their requests ask for {max_out} tokens"
        )
    return fitted


def check_row_lengths(rows: list[InputRow], deployment: Deployment | None) -> None:
    """Refuse input rows that ask for more output tokens than the deployment's max_output_len (none: a remote
    server's limits are not known)."""
    if deployment is None:
        return
    max_out = int(deployment.point.max_output_len)
    for number, row in enumerate(rows, start=1):
        if row.max_tokens is not None and row.max_tokens > max_out:
            raise UsageError(
                f"input row {number} asks for max_tokens {row.max_tokens}, more than this deployment's "
                f"max_output_len {max_out}",
                hint=f"keep max_tokens <= {max_out} in the input data",
            )


def resolve_openai(settings: PerfSettings) -> tuple[Endpoint, OpenAIWorkload, dict[str, Any]]:
    """The OpenAI-compatible server to load, its workload, and what the summary records of it (``api``,
    ``tokenizer``, ``served_by``: the owner its model list names, e.g. vllm).

    The model: ``settings.model``, else the only one the server lists (UsageError naming them when it lists
    several). The tokenizer is loaded here, before the load: prompts of exact lengths cannot be made without it. The
    metrics: ``settings.metrics_url``, else the server's ``/metrics`` (vLLM's and SGLang's Prometheus; a server
    without one costs nothing).
    """
    from .download import tokenizer_folder
    from .perf.openai_api import OpenAIControl, OpenAIWorkload, base_url

    url = base_url(settings.url or "")
    use = settings.inputs.tokenizer_use
    if use is not None and settings.tokenizer is None:
        raise UsageError(
            f"{use} need the served model's tokenizer",
            hint="pass --tokenizer (its Hugging Face tokenizer folder or Hub name)",
        )

    async def served_models() -> list[dict[str, Any]]:
        control = OpenAIControl(url)
        try:
            return await control.models()
        finally:
            await control.close()

    served = asyncio.run(served_models())
    names = [entry["id"] for entry in served]
    if settings.model is None and len(names) != 1:
        raise UsageError(
            f"the server at {url} serves {len(names)} models ({', '.join(names) or 'none'}): which one to load?",
            hint="name it with --model",
        )
    model = settings.model or names[0]
    api = settings.api or "completions"
    folder = tokenizer_folder(settings.tokenizer) if settings.tokenizer is not None else None
    workload = OpenAIWorkload(model, api=api, tokenizer=folder, extra_body=settings.extra_body)
    if folder is not None:
        workload.tokenizer  # noqa: B018 - a tokenizer that cannot be loaded is named before the load
    owner = next((entry.get("owned_by") for entry in served if entry["id"] == model), None)
    header = {"api": api, "tokenizer": settings.tokenizer, "served_by": owner}
    return Endpoint(url, "openai", settings.metrics_url or f"{url}/metrics"), workload, header


def resolve_target(settings: PerfSettings, warn: Callable[[str], None]) -> tuple[Endpoint, Deployment | None]:
    """The endpoint to load and the deployment it serves (see :func:`resolve_endpoint`): None for a server that
    trtdeploy did not start here, whose workload comes from its model's configuration (:mod:`trtdeploy.remote`),
    never from a deployment folder that merely happens to be here."""
    if settings.deployment is not None:
        deployment = Deployment.load(settings.deployment)
        endpoint, served = resolve_endpoint(
            settings.url, settings.protocol, settings.metrics_url, deployment=deployment.path
        )
        if served is not None and resolved_path(served) != resolved_path(deployment.path):
            warn(f"the server at {endpoint.url} serves {served}, not {deployment.path}; loading it as the latter")
        return endpoint, deployment
    endpoint, served = resolve_endpoint(settings.url, settings.protocol, settings.metrics_url)
    return endpoint, Deployment.load(served) if served is not None else None


#: The build point's fields a summary records (under ``build``): what tells one run's deployment from another's.
BUILD_FIELDS = (
    *("model", "engine", "precision", "gpu", "max_batch_size", "tp", "pp", "replicas", "mode", "engine_version"),
    "gpus_needed",
)


def build_of(deployment: Deployment) -> dict[str, Any]:
    """The ``build`` of a run's summary: the deployment's point name and BUILD_FIELDS, so that the run can be told
    apart (``trtdeploy report`` labels runs by them) without the deployment folder."""
    point = deployment.point
    return {"point": point.name, **{name: getattr(point, name) for name in BUILD_FIELDS}}


def _asr_headers(url: str) -> dict[str, str]:
    """The key to the restricted APIs of the Whisper server at ``url``, when trtdeploy started it here."""
    from .server import current_server

    return current_server(check_url(url, flag="--asr")).restricted_headers("grpc")


#: The not-decoupled Whisper model of a streaming deployment (its ``whisper_bls`` streams partial transcripts).
WHISPER_OFFLINE_MODEL = "whisper_bls_offline"


def resolve_asr(target: str, *, model: str | None = None, language: str | None = None) -> AsrSettings:
    """Where ``--asr TARGET`` transcribes: a Whisper deployment folder (the running server ``trtdeploy serve``
    started for it, and its model that answers in one response: ``whisper_bls`` of an offline deployment,
    ``whisper_bls_offline`` of a streaming one) or ``HOST:PORT`` of a Triton serving ``whisper_bls``. ``model``
    overrides the model's name. Nothing is contacted here: :func:`benchmark` checks the model before the load."""
    from .server import servers_of

    folder = Path(target).expanduser()
    if not folder.is_dir():
        if folder.exists():
            raise UsageError(f"--asr {target}: not a folder", hint="pass a whisper deployment folder or HOST:PORT")
        if ":" not in target:
            raise UsageError(
                f"--asr {target}: no such folder, and not HOST:PORT",
                hint="pass a whisper deployment folder, or the gRPC HOST:PORT of a Triton serving whisper_bls",
            )
        check_url(target, flag="--asr", schemes=("grpc",), example="e.g. --asr localhost:8001 (Triton's gRPC)")
        return AsrSettings(url=target, model=model or WHISPER_MODEL, language=language)
    try:
        deployment = Deployment.load(folder)
    except TrtDeployError as exc:
        raise type(exc)(f"--asr {target}: {exc.message}", hint=exc.hint) from None
    if WHISPER_MODEL not in deployment.models:
        raise UsageError(
            f"--asr {target}: {deployment.path} is a {deployment.model} deployment, not a whisper one "
            f"(it has no {WHISPER_MODEL} model)",
            hint="pass a deployment built with `trtdeploy build whisper`, or HOST:PORT of a Whisper server",
        )
    default = WHISPER_OFFLINE_MODEL if deployment.decoupled else WHISPER_MODEL
    serving = servers_of(deployment.path)
    if not serving:
        raise ServerError(
            f"--asr {target}: no running server serves the whisper deployment {deployment.path}",
            hint=f"run `trtdeploy serve {deployment.path} --background --grpc-port PORT` (ports other than the "
            "TTS server's), then perf again",
        )
    info = serving[0]
    assert info.grpc_url is not None
    return AsrSettings(
        url=info.grpc_url, model=model or default, language=language, headers=info.restricted_headers("grpc")
    )


def _where_it_stopped(writer: ReportWriter) -> str:
    """``2 levels complete; concurrency 4 cut short after 37 of 64 requests``, from the summaries written."""
    complete = [level for level in writer.levels if level["status"] == "complete"]
    parts = [f"{len(complete)} level{'s' if len(complete) != 1 else ''} complete"]
    cut = [level for level in writer.levels if level["status"] != "complete"]
    if cut:
        level = cut[-1]
        where = level_label(level["concurrency"], level["request_rate"])
        planned = f" of {level['planned_requests']}" if level["planned_requests"] is not None else ""
        parts.append(f"{where} cut short after {level['requests']}{planned} requests")
    return "; ".join(parts)


def check_for_workload(settings: PerfSettings, workload: Workload) -> None:
    """Refuse options that ``workload``'s family cannot take (UsageError), before any server is asked: token
    lengths and token-count inputs for speech, an SLO's keys, ``--asr`` for a non-TTS model, ``--text-prefix`` for a
    non-ASR one."""
    if workload.family != "llm" and settings.inputs.isl is not None:
        raise UsageError("--isl sets the prompt length of LLM workloads; speech inputs have no token length")
    if workload.family != "llm" and (settings.inputs.isl_stddev or settings.inputs.osl_stddev):
        raise UsageError("--isl-stddev and --osl-stddev vary the lengths of LLM prompts and answers only")
    token_inputs = {
        "--shared-prefixes": settings.inputs.shared_prefixes,
        "--osl-from-reference": settings.inputs.osl_from_reference,
        "--trace": settings.inputs.trace,
    }
    given = [flag for flag, value in token_inputs.items() if value]
    if workload.family != "llm" and given:
        raise UsageError(f"{given[0]} makes LLM requests (token counts); {workload.model_name!r} is not an LLM")
    if settings.slo is not None:
        settings.slo.check(workload.family, settings.stream)  # before the server: the workload's keys
    if settings.asr is not None and workload.family != "tts":
        raise UsageError(f"--asr/--asr-url scores speech; {workload.model_name!r} is not a TTS model")
    if settings.options.text_prefix is not None and workload.family != "asr":
        raise UsageError(f"--text-prefix is the decoder prompt of Whisper; {workload.model_name!r} is not an ASR model")


def benchmark(
    settings: PerfSettings,
    *,
    progress: ProgressReporter | None = None,
    warn: Callable[[str], None] | None = None,
) -> PerfRun:
    """Run ``trtdeploy perf``: resolve the target, check the reports folder, load the inputs, run every level,
    writing the reports as it goes. ``warn`` gets one line per problem that does not stop the run (default:
    stderr). A lost server raises ServerLost (exit 5), Ctrl-C Interrupted (exit 130), after the reports of what
    was measured are complete and marked ``server_lost`` or ``interrupted``."""
    warn = warn or warn_on_stderr
    deployment: Deployment | None = None
    remote: RemoteTarget | None = None
    target: dict[str, Any]
    if settings.endpoint == "openai":
        endpoint, workload, served = resolve_openai(settings)
        offline_model = None
        target = {"endpoint": "openai", "deployment": None, "build": None, **served}
    else:
        endpoint, deployment = resolve_target(settings, warn)
        if deployment is None:
            remote = resolve_remote(
                endpoint,
                settings.model,
                forced=settings.workload,
                tokenizer=settings.tokenizer,
                inputs_use=settings.inputs.tokenizer_use,
                warn=warn,
            )
            workload, offline_model = remote.workload, remote.offline_model
        else:
            workload, offline_model = deployment_workload(settings, deployment)
        target = {
            "endpoint": "triton",
            "deployment": None if deployment is None else str(deployment.path),
            "build": None if deployment is None else build_of(deployment),
            "remote": None if remote is None else remote.to_dict(),
        }
    check_for_workload(settings, workload)
    asr = settings.asr
    if asr is not None:
        asr = replace(asr, headers=asr.headers or _asr_headers(asr.url))
        asyncio.run(check_whisper(asr.url, asr.model, asr.headers))
    settings = apply_limits(settings, deployment, workload)
    output_dir = settings.output_dir or default_output_dir(_folder_name(workload.model_name, settings.endpoint))
    created = prepare_output_dir(output_dir)  # before the load: a run is not lost for want of a folder
    writer = ReportWriter(output_dir, plots=settings.plots, warn=warn)
    writer.header = {
        "started_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        **target,
        "input": settings.inputs.describe(workload.family),
    }
    try:
        inputs = settings.inputs
        rows = [] if inputs.generated else inputs.load(workload)
        if inputs.osl_from_reference:
            rows = lengths_from_references(rows, workload, deployment, warn)
        if deployment is not None:
            check_row_lengths(rows, deployment)
        if inputs.trace is not None and inputs.caps is not None and any(inputs.trace.clipped(inputs.caps)):
            warn(f"the lengths beyond this deployment's limits are clipped to them: {inputs.describe()}")
        make_rows = partial(inputs.synthetic_rows, workload, seed=settings.load.seed) if inputs.generated else None
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
                make_rows=make_rows,
                observer=writer,
                warn=warn,
                offline_model=offline_model,
            )
        )
    except KeyboardInterrupt:
        if not _keep(writer, created, "interrupted"):
            raise Interrupted("interrupted before any level started; nothing was written") from None
        raise Interrupted(f"{_where_it_stopped(writer)}; results so far in {output_dir}") from None
    except ServerLost as exc:
        kept = _keep(writer, created, "server_lost")
        raise ServerLost(
            f"{exc.message}: {_where_it_stopped(writer)}; results so far in {output_dir}" if kept else exc.message,
            hint="see the server's log; `trtdeploy stop` cleans up after a server that died",
        ) from None
    except BaseException:
        _keep(writer, created, "failed")
        raise
    if "search" in run.summary:
        writer.extra["search"] = run.summary["search"]
    writer.finish("complete")  # the measurements are complete on disk before any scoring
    run.output_dir = output_dir
    if asr is not None:
        try:
            score_reports(writer, asr)
        except TrtDeployError as exc:
            warn(f"no WER/CER ({exc.message}); the other reports are written to {output_dir}")
            raise
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted while scoring the speech; the measurements are in {output_dir}") from None
        writer.write_summary("complete")
    run.summary = writer.summary("complete")
    return run


def _folder_name(model: str, endpoint: str) -> str:
    """The default run folder's name part: the model's (the last part of an OpenAI-compatible server's model name,
    which may be a path or ``org/name``, then ``-openai``)."""
    if endpoint == "triton":
        return model
    return f"{model.rstrip('/').rsplit('/', 1)[-1] or 'model'}-openai"


def _keep(writer: ReportWriter, created: list[Path], status: str) -> bool:
    """End a run cut short: complete its reports marked ``status`` if a level had started, else remove what it
    wrote (and the folders made for it). Whether anything was kept."""
    if writer.levels:
        writer.finish(status)
        return True
    writer.discard()
    remove_empty(created)
    return False
