"""Planning and running a build: one deployment folder per build point, written all-or-nothing.

A build goes into a hidden scratch folder next to its destination and is renamed into place only when every step
has succeeded and the manifest says ``complete``. A failed build is kept as ``<point>.failed/`` (manifest status
``failed``, logs inside) so that nothing half-written ever looks like a deployment.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import __version__, gpus, plugins
from .deployment import Deployment
from .download import Checkpoint, download, fetch_config, local_checkpoint
from .engines.base import BuildStep, Engine
from .errors import BuildError, TrtDeployError, UsageError
from .fsutil import atomic_dir, cache_dir, scratch_beside, swap_into_place
from .manifest import COMPLETE, SCHEMA, reusable_manifest, write_manifest
from .memory import WEIGHT_BYTES, MemoryEstimate, ModelShape, estimate
from .repo import TemplateSource, render_repository, template_models
from .server._process import process_alive
from .spec import KV_CACHE_DTYPES, MODES, BuildContext, BuildPoint, Mode, ModelSpec, option_names, parse_options

LLM_TEMPLATE = "tensorrt_llm"


@dataclass(frozen=True)
class BuildRequest:
    """What the user asked for on the command line."""

    model: str
    engine: str = "auto"
    gpu: str | None = None
    precision: str | None = None
    #: None: the GPU profile's default (8 on the CPU).
    max_batch_size: int | None = None
    mode: Mode = "streaming"
    max_input_len: int | None = None
    max_output_len: int | None = None
    model_dir: Path | None = None
    revision: str | None = None
    output_root: Path = Path("deployments")
    options: dict[str, str] = field(default_factory=dict)
    tp: int = 1
    pp: int = 1
    #: None: the GPU profile's default.
    max_num_tokens: int | None = None
    #: The TensorRT-LLM version to plan for (``--trtllm-version``); None: the installed one.
    engine_version: str | None = None
    #: Suffix of the deployment folder (see BuildPoint.variant).
    variant: str = ""
    #: Copies of the model behind one endpoint, each on GPUs of its own.
    replicas: int = 1
    #: ``--kv-cache-dtype``, ``--calib-dataset``, ``--calib-size`` (see BuildPoint); None: the engine's defaults.
    kv_cache_dtype: str | None = None
    calib_dataset: Path | None = None
    calib_size: int | None = None


#: The BuildPoint fields only some engines honour (an engine lists those it does in ``build_options``), and their flags.
ENGINE_OPTION_FLAGS = {
    "kv_cache_dtype": "--kv-cache-dtype",
    "calib_dataset": "--calib-dataset",
    "calib_size": "--calib-size",
}


@dataclass
class Plan:
    """Everything a build will do, resolved before anything runs (``--dry-run`` prints it)."""

    spec: ModelSpec
    engine: Engine
    point: BuildPoint
    context: BuildContext
    source: Checkpoint | None  # None: downloaded from ``spec.default_repo`` when the build runs
    repo_id: str
    revision: str | None
    steps: list[BuildStep]
    templates: list[TemplateSource]
    notes: list[str] = field(default_factory=list)

    @property
    def deployment_dir(self) -> Path:
        return self.context.deployment_dir

    @property
    def triton_models(self) -> list[str]:
        return [model for source in self.templates for model in source.models]

    def repository_files(self) -> list[str]:
        """The files the model repository will hold (templates lose their ``.j2``)."""
        files = []
        for source in self.templates:
            for model in source.models:
                for path in sorted((source.root / model).rglob("*")):
                    if path.is_file() and "__pycache__" not in path.parts:
                        rel = f"model_repo/{model}/{path.relative_to(source.root / model).as_posix()}"
                        files.append(rel.removesuffix(".j2"))
        return files

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.spec.name,
            "deployment": str(self.deployment_dir),
            "point": self.point.as_dict(),
            "checkpoint": str(self.source.path) if self.source else f"hf://{self.repo_id}@{self.revision or 'main'}",
            "llm_dir": str(self.context.llm_dir),
            "steps": [
                {"name": s.name, "description": s.description, "command": list(s.argv) or None} for s in self.steps
            ],
            "triton_models": self.triton_models,
            "files": ["manifest.json", "checkpoint/", "engines/", "logs/"] + self.repository_files(),
            "entry_model": self.spec.entry_model(self.point.mode),
            "notes": self.notes,
        }


@dataclass(frozen=True)
class BuildResult:
    deployment: Deployment
    #: True when an up-to-date deployment was found and nothing was rebuilt.
    up_to_date: bool


def plan(request: BuildRequest, *, dry_run: bool = False) -> Plan:
    """Resolve a request into a plan; every invalid input is rejected here, before anything runs.

    A dry run plans for any machine: the engine need not be installed here.
    """
    spec = plugins.get_model(request.model)
    selection = gpus.resolve(request.gpu)
    engine = plugins.get_engine(request.engine, on_cpu=selection.profile is None, encoder_decoder=spec.encoder_decoder)
    reason = engine.unavailable_reason()
    if reason and not dry_run:
        raise UsageError(f"engine {engine.name!r} is not usable here: {reason}", hint="--dry-run shows its plan")
    if request.mode not in spec.modes:
        raise UsageError(f"model {spec.name!r} has no {request.mode!r} mode", hint=f"modes: {', '.join(spec.modes)}")
    if request.mode not in MODES:
        raise UsageError(f"unknown mode {request.mode!r}", hint=f"modes: {', '.join(MODES)}")
    profile = selection.profile
    defaults = profile.defaults if profile else None
    max_batch_size = request.max_batch_size
    if max_batch_size is None:
        max_batch_size = defaults.max_batch_size if defaults else 8
    max_num_tokens = request.max_num_tokens
    if max_num_tokens is None:
        max_num_tokens = defaults.max_num_tokens if defaults else gpus.DEFAULT_MAX_NUM_TOKENS
    checks = (("--max-batch-size", max_batch_size), ("--max-num-tokens", max_num_tokens))
    for flag, value in (*checks, ("--tp", request.tp), ("--pp", request.pp), ("--replicas", request.replicas)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    device = "cpu" if profile is None else "cuda"
    default = engine.default_encoder_decoder_precision if spec.encoder_decoder else engine.default_precision
    precision = request.precision or default(device)
    if precision not in engine.precisions:
        raise UsageError(
            f"engine {engine.name!r} cannot build precision {precision!r}",
            hint=f"precisions: {', '.join(engine.precisions)}",
        )
    max_input_len = spec.default_max_input_len if request.max_input_len is None else request.max_input_len
    max_output_len = spec.default_max_output_len if request.max_output_len is None else request.max_output_len
    if max_input_len < 1 or max_output_len < 1:
        raise UsageError("--max-input-len and --max-output-len must be >= 1")
    if request.model_dir is not None and request.revision is not None:
        raise UsageError("--revision picks what to download; it cannot go with --model-dir (a local folder)")
    options, engine_options = _split_options(request.options, spec, engine)
    _check_engine_options(request, engine, dry_run)
    point = BuildPoint(
        model=spec.name,
        engine=engine.name,
        precision=precision,
        max_batch_size=max_batch_size,
        mode=request.mode,
        gpu=selection.label,
        max_input_len=max_input_len,
        max_output_len=max_output_len,
        tp=request.tp,
        pp=request.pp,
        options=tuple(sorted(options.items())),
        engine_options=tuple(sorted(engine_options.items())),
        max_num_tokens=max_num_tokens,
        engine_version=engine.resolve_version(request.engine_version, dry_run=dry_run),
        variant=request.variant,
        replicas=request.replicas,
        kv_cache_dtype=request.kv_cache_dtype,
        calib_dataset=str(request.calib_dataset.expanduser().absolute()) if request.calib_dataset else None,
        calib_size=request.calib_size,
    )
    _check_gpus(point, selection, dry_run)
    source = local_checkpoint(request.model_dir) if request.model_dir else None
    if source is not None:
        spec.validate_checkpoint(source.path)
        checkpoint_path = source.path
    elif dry_run or spec.llm_conversion is not None:
        # touches nothing: the checks on the model's shape wait for config.json (the notes say so), which a
        # converted LLM gets only after the download
        checkpoint_path = _hub_cache_path(spec.default_repo, request.revision)
    else:  # config.json alone, now: those checks run before the weights are downloaded
        fetched = fetch_config(spec.default_repo, revision=request.revision, subfolder=spec.llm_subfolder)
        checkpoint_path = fetched or _hub_cache_path(spec.default_repo, request.revision)
    deployment_dir = (request.output_root / spec.name / point.name).resolve()
    context = BuildContext(
        point=point,
        deployment_dir=deployment_dir,
        checkpoint_dir=checkpoint_path,
        llm_dir=_llm_dir(spec, checkpoint_path, source),
        engine_dir=deployment_dir / "engines",
        model_repo_dir=deployment_dir / "model_repo",
        options=options,
        llm_streams=spec.llm_streams,
        encoder_decoder=spec.encoder_decoder,
        gpu_profile=profile,
        gpu_count=_build_gpus(selection, dry_run),
    )
    _validate(spec, engine, context)  # a dry run before the download checks what it knows: config.json is not here
    return _assemble(spec, engine, context, source, request.revision)


def _validate(spec: ModelSpec, engine: Engine, context: BuildContext) -> None:
    """Refuse lengths above the checkpoint's position limit, then what the engine cannot build (run whenever the
    checkpoint's LLM is new: planned, downloaded, converted)."""
    limit = spec.position_limit(context)
    point = context.point
    if limit is not None and point.max_seq_len > limit[0]:
        positions, what = limit
        output_len = min(point.max_output_len, positions // 2)
        raise UsageError(
            f"--max-input-len {point.max_input_len} + --max-output-len {point.max_output_len} = {point.max_seq_len} "
            f"is more than the {positions} positions of {what}",
            hint=f"keep the two at {positions} or less together, e.g. --max-input-len {positions - output_len} "
            f"--max-output-len {output_len}",
        )
    engine.validate(context)


def _split_options(raw: dict[str, str], spec: ModelSpec, engine: Engine) -> tuple[dict[str, Any], dict[str, Any]]:
    """``-o`` settings as the model's (every option, defaults included) and the engine's (those given): a key is
    the model's where it names one, else the engine's; UsageError naming both sets for a key neither knows."""
    for_model = set(option_names(spec.Options))
    for_engine = set(option_names(engine.Options))
    unknown = [key for key in raw if key not in for_model | for_engine]
    if unknown:
        known = "; ".join(
            f"{owner}: {', '.join(sorted(names)) or 'none'}"
            for owner, names in ((f"model {spec.name}", for_model), (f"engine {engine.name}", for_engine))
        )
        raise UsageError(
            f"unknown option {unknown[0]!r} for model {spec.name!r} or engine {engine.name!r}",
            hint=f"known options: {known}",
        )
    model_raw = {key: value for key, value in raw.items() if key in for_model}
    engine_raw = {key: value for key, value in raw.items() if key not in for_model}
    given = parse_options(engine.Options, engine_raw, owner=f"engine {engine.name!r}")
    return spec.parse_options(model_raw), {key: given[key] for key in engine_raw}


def _check_engine_options(request: BuildRequest, engine: Engine, dry_run: bool) -> None:
    """Refuse the engine options this engine cannot honour, and values no engine could."""
    given = [name for name in ENGINE_OPTION_FLAGS if getattr(request, name) is not None]
    refused = [ENGINE_OPTION_FLAGS[name] for name in given if name not in engine.build_options]
    if refused:
        raise UsageError(
            f"engine {engine.name!r} cannot honour {', '.join(refused)}",
            hint="these tune TensorRT-LLM's quantization and KV cache: use --engine trtllm, or drop them",
        )
    if request.kv_cache_dtype is not None and request.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise UsageError(
            f"--kv-cache-dtype {request.kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}",
            hint="leave it out for the precision's default",
        )
    if request.calib_size is not None and request.calib_size < 1:
        raise UsageError(f"--calib-size must be >= 1, got {request.calib_size}")
    if request.calib_dataset is not None and not dry_run and not request.calib_dataset.expanduser().exists():
        raise UsageError(
            f"--calib-dataset {request.calib_dataset} does not exist",
            hint="pass a local dataset folder (what datasets.load_dataset reads), as quantize.py's --calib_dataset",
        )


def _check_gpus(point: BuildPoint, selection: gpus.GpuSelection, dry_run: bool) -> None:
    """Reject a point the target GPUs cannot run: precision, GPU count."""
    profile = selection.profile
    if profile is None:
        if point.gpus_needed > 1:
            raise UsageError(f"{_gpu_layout(point)} needs {point.gpus_needed} GPUs and the build targets the CPU")
        return
    reason = profile.unsupported_reason(point.precision)
    if reason:
        raise UsageError(reason, hint=f"precisions on the {profile.name}: {', '.join(profile.precisions)}")
    count = selection.count
    if count is None and not dry_run:
        detected = gpus.detect()
        count = detected.count if detected and detected.profile == profile else None
    if count is not None and point.gpus_needed > count:
        raise UsageError(
            f"{_gpu_layout(point)} needs {point.gpus_needed} GPUs and {count} {profile.name} are available",
            hint=f"lower --tp/--pp/--replicas, or name the count with --gpu {profile.name}:{point.gpus_needed}",
        )


def _build_gpus(selection: gpus.GpuSelection, dry_run: bool) -> int | None:
    """The GPUs the build itself may use: those named, but no more than this machine has of them (engines for
    nodes beyond this one, planned with ``--gpu H100:16``, are built here with as many workers as it has GPUs)."""
    if dry_run or selection.profile is None:
        return selection.count
    detected = gpus.detect()
    if detected is None or detected.profile != selection.profile or not detected.count:
        return selection.count
    return min(selection.count or detected.count, detected.count)


def _gpu_layout(point: BuildPoint) -> str:
    layout = f"tp{point.tp}pp{point.pp}"
    return f"{point.replicas} replicas of {layout}" if point.replicas > 1 else layout


def memory_estimate(context: BuildContext) -> MemoryEstimate | None:
    """The point's memory per GPU, when its GPU and the checkpoint's config.json are known."""
    point, profile = context.point, context.gpu_profile
    shape = ModelShape.read(context.llm_dir) if profile else None
    if shape is None or profile is None or point.precision not in WEIGHT_BYTES:
        return None
    return estimate(
        shape,
        precision=point.precision,
        max_batch_size=point.max_batch_size,
        max_seq_len=point.max_seq_len,
        max_num_tokens=point.max_num_tokens,
        memory_gib=profile.memory_gib,
        tp=point.tp,
        pp=point.pp,
        kv_cache_dtype=point.kv_cache_dtype,
    )


def _memory_notes(context: BuildContext) -> list[str]:
    """Reject a point whose weights and full KV cache cannot fit its GPUs; else say how it fits."""
    if context.gpu_profile is None:
        return []
    found = memory_estimate(context)
    if found is None:
        return [
            f"memory fit not checked: no readable {context.llm_dir / 'config.json'} yet (a build fetches it first, "
            "and checks before it downloads the weights)"
        ]
    point = context.point
    if not found.fits:
        raise UsageError(
            f"{point.name} does not fit a {context.gpu_profile.name}: {found.describe()}",
            hint="lower --max-batch-size or the lengths, pick a smaller precision, or raise --tp/--pp",
        )
    return [f"memory: {found.describe()}, for {point.max_batch_size} sequences of {point.max_seq_len} tokens"]


def _assemble(
    spec: ModelSpec, engine: Engine, context: BuildContext, source: Checkpoint | None, revision: str | None
) -> Plan:
    context = replace(
        context,
        llm_input_names=engine.input_names(context),
        llm_noise_keyed_by_position=engine.noise_keyed_by_position,
        encoder_features_dtype=engine.encoder_features_dtype(context),
    )
    notes = _memory_notes(context)
    variables = {"ctx": context, "engine": engine.template_context(context), "model": spec.template_context(context)}
    templates = [
        TemplateSource(engine.llm_templates(context), (LLM_TEMPLATE,), variables),
        TemplateSource(spec.templates_dir, _model_templates(spec, context.point.mode), variables),
    ]
    return Plan(
        spec=spec,
        engine=engine,
        point=context.point,
        context=context,
        source=source,
        repo_id=spec.default_repo,
        revision=revision,
        steps=engine.steps(context),
        templates=templates,
        notes=notes + spec.notes(context) + engine.notes(context),
    )


def _model_templates(spec: ModelSpec, mode: Mode) -> tuple[str, ...]:
    """The plugin's template models for ``mode``; BuildError when the plugin names one it has no template for."""
    available = template_models(spec.templates_dir)
    chosen = spec.triton_models(mode)
    if chosen is None:
        return available
    unknown = sorted(set(chosen) - set(available))
    if unknown:
        raise BuildError(f"model {spec.name!r} asks for templates it does not have: {', '.join(unknown)}")
    return tuple(sorted(chosen))


def _hub_cache_path(repo_id: str, revision: str | None) -> Path:
    """Where a Hub download will land (shown by dry runs; the real path is known after the download)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "snapshots" / (revision or "main")


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def content_hash(built: Plan) -> str:
    """Hash of every input of the build: point, checkpoint identity, templates and tool versions."""
    assert built.source is not None
    inputs = {
        "point": built.point.as_dict(),
        "checkpoint": built.source.identity(),
        **({"llm_conversion": built.spec.llm_conversion} if built.spec.llm_conversion else {}),
        "templates": [_tree_hash(source.root / model) for source in built.templates for model in source.models],
        "versions": _versions(built),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def _versions(built: Plan) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {"trtdeploy": __version__, **built.engine.versions()}
    module = type(built.spec).__module__.split(".")[0]
    try:
        versions[module] = version(module.replace("_", "-"))
    except PackageNotFoundError:
        versions[module] = getattr(__import__(module), "__version__", "unknown")
    return versions


def run(request: BuildRequest, *, force: bool = False, on_step: Callable[[str], None] = lambda _: None) -> BuildResult:
    """Plan and run a build: fetch the checkpoint, run the engine's steps, render and validate the repository."""
    return execute(plan(request), force=force, on_step=on_step)


def execute(built: Plan, *, force: bool = False, on_step: Callable[[str], None] = lambda _: None) -> BuildResult:
    """Run a build that :func:`plan` made (not for a dry run's plan)."""
    if built.source is None:
        on_step(f"download {built.repo_id}")
        checkpoint = download(built.repo_id, revision=built.revision)
        built.spec.validate_checkpoint(checkpoint.path)
        context = _relocate(built.context, built.spec, checkpoint)
        _validate(built.spec, built.engine, context)
        built = _assemble(built.spec, built.engine, context, checkpoint, built.revision)
    if built.spec.llm_conversion is not None and not built.context.llm_dir.is_dir():
        built = _convert_llm(built, on_step)
    digest = content_hash(built)
    final = built.deployment_dir
    if not force and _is_up_to_date(final, digest):
        return BuildResult(Deployment.load(final), up_to_date=True)
    _remove_stale_scratch(final)
    reusable = _reusable_engines(final, engine_key(built))
    scratch = scratch_beside(
        final, prefix=f".{final.name}.building-{os.getpid()}-", error=UsageError, hint="pass a writable --output-dir"
    )
    manifest = _manifest(built, digest)
    try:
        _execute(built, scratch, manifest, on_step, reusable)
    except BaseException as exc:
        manifest["status"] = "failed"
        manifest["error"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
        write_manifest(scratch, manifest)
        failed = final.with_name(final.name + ".failed")
        shutil.rmtree(failed, ignore_errors=True)
        scratch.rename(failed)
        if isinstance(exc, BuildError):
            exc.hint = exc.hint or f"logs are in {failed / 'logs'}"
        raise
    swap_into_place(scratch, final)
    shutil.rmtree(final.with_name(final.name + ".failed"), ignore_errors=True)
    return BuildResult(Deployment.load(final), up_to_date=False)


def _relocate(context: BuildContext, spec: ModelSpec, checkpoint: Checkpoint) -> BuildContext:
    return replace(context, checkpoint_dir=checkpoint.path, llm_dir=_llm_dir(spec, checkpoint.path, checkpoint))


def _llm_dir(spec: ModelSpec, checkpoint_path: Path, source: Checkpoint | None) -> Path:
    """Where the Hugging Face causal LM is: inside the checkpoint, or the checkpoint's conversion in the cache
    (one folder per checkpoint and conversion version)."""
    if spec.llm_conversion is None:
        return checkpoint_path / spec.llm_subfolder if spec.llm_subfolder else checkpoint_path
    identity = source.identity() if source is not None else {"path": str(checkpoint_path)}
    key = json.dumps({"checkpoint": identity, "conversion": spec.llm_conversion}, sort_keys=True)
    return cache_dir() / "llm" / spec.name / hashlib.sha256(key.encode()).hexdigest()[:16]


def _convert_llm(built: Plan, on_step: Callable[[str], None]) -> Plan:
    """Convert the checkpoint's LLM into its cache folder (all at once) unless done before, then check the build
    against the LLM's config.json, which exists only now."""
    context = built.context
    on_step(f"convert the LLM of {context.checkpoint_dir} into {context.llm_dir}")

    def populate(dest: Path) -> None:
        try:
            built.spec.convert_llm(context.checkpoint_dir, dest)
        except TrtDeployError:
            raise
        except Exception as exc:  # the plugin's conversion failed: one line naming it, the folder is dropped
            raise BuildError(
                f"converting the LLM of {context.checkpoint_dir} ({built.spec.name}) failed: "
                f"{type(exc).__name__}: {exc}",
                hint="is the checkpoint complete? download it again, or report the error with the model plugin",
            ) from exc

    atomic_dir(context.llm_dir, populate, error=BuildError, hint="point TRTDEPLOY_CACHE_DIR at a writable folder")
    _validate(built.spec, built.engine, context)
    return _assemble(built.spec, built.engine, context, built.source, built.revision)


def engine_key(built: Plan) -> str | None:
    """Hash of what the engine steps depend on: their commands, the checkpoint, the toolkit version and the GPU.

    A deployment whose key matches keeps its engines when anything else changes (templates, runtime settings).
    """
    if not built.steps or built.source is None:
        return None
    inputs = {
        "steps": [[step.name, list(step.argv), step.env] for step in built.steps],
        "checkpoint": built.source.identity(),
        "engine_version": built.point.engine_version,
        "gpu": built.point.gpu,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def _reusable_engines(final: Path, key: str | None) -> Path | None:
    """The engines folder of the complete deployment at ``final`` when it was built from the same engine inputs."""
    engines = final / "engines"
    if key is not None and (reusable_manifest(final) or {}).get("engine_key") == key and engines.is_dir():
        return engines
    return None


def _is_up_to_date(final: Path, digest: str) -> bool:
    return (reusable_manifest(final) or {}).get("hash") == digest


def _remove_stale_scratch(final: Path) -> None:
    """Scratch folders of builds whose process is gone (killed, power loss) are removed."""
    for scratch in final.parent.glob(f".{final.name}.building-*"):
        pid_text = scratch.name.split(".building-")[1].split("-")[0]
        if pid_text.isdigit() and not process_alive(int(pid_text)):
            shutil.rmtree(scratch, ignore_errors=True)


def _manifest(built: Plan, digest: str) -> dict[str, Any]:
    assert built.source is not None
    return {
        "schema": SCHEMA,
        "status": "building",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hash": digest,
        "point": built.point.as_dict(),
        "source": built.source.identity(),
        "paths": {"checkpoint": str(built.context.checkpoint_dir), "llm": str(built.context.llm_dir)},
        "entry_model": built.spec.entry_model(built.point.mode),
        "llm_model_name": built.context.llm_model_name,
        "server_ranks": built.point.world_size if built.engine.launches_ranks and built.point.replicas == 1 else 1,
        "server_env": built.engine.server_env(built.context),
        "triton_models": built.triton_models,
        "versions": _versions(built),
        "engine_key": engine_key(built),
        "steps": [],
    }


def _execute(
    built: Plan, scratch: Path, manifest: dict[str, Any], on_step: Callable[[str], None], reusable: Path | None
) -> None:
    started = time.monotonic()
    logs = scratch / "logs"
    logs.mkdir()
    (scratch / "checkpoint").symlink_to(built.context.checkpoint_dir, target_is_directory=True)
    if reusable is not None:
        on_step("reuse the engines of the previous build (same commands, checkpoint, toolkit and GPU)")
        shutil.copytree(reusable, scratch / "engines", copy_function=os.link)  # hard links: no copy of the data
        manifest["steps"] = [{"name": step.name, "reused": True, "returncode": 0} for step in built.steps]
    else:
        (scratch / "engines").mkdir()
    write_manifest(scratch, manifest)
    for step in built.steps if reusable is None else ():
        on_step(step.description or step.name)
        record = _run_step(step, logs / f"{step.name}.log", cwd=scratch)
        manifest["steps"].append(record)
        write_manifest(scratch, manifest)
        if record.get("missing"):
            raise BuildError(
                f"build step {step.name!r} needs {record['missing'][0]}, which does not exist",
                hint="build inside the serving image (see the Dockerfile) or point TRTDEPLOY_TRTLLM_EXAMPLES at the "
                "examples/ folder of the same TensorRT-LLM release",
            )
        if record.get("missing_program"):
            program, reason = record["missing_program"], record["cannot_run"]
            raise BuildError(
                f"build step {step.name!r} runs {program!r}, which cannot be run: {reason}",
                hint="install it, or build inside the serving image (see the Dockerfile)",
            )
        if record["returncode"] != 0:
            tail = _tail(logs / f"{step.name}.log")
            raise BuildError(f"build step {step.name!r} failed (exit code {record['returncode']})", details=tail)
    on_step("render model repository")
    render_started = time.monotonic()
    record = {"name": "render", "returncode": 0, "log": "logs/render.log"}
    try:
        configs = render_repository(built.templates, scratch / "model_repo")
        (logs / "render.log").write_text("".join(f"{path} validated\n" for path in configs.values()))
    except BuildError as exc:
        (logs / "render.log").write_text(exc.message + "\n")
        record["returncode"] = 1
        raise
    finally:
        manifest["steps"].append({**record, "duration_s": round(time.monotonic() - render_started, 3)})
    manifest["status"] = COMPLETE
    manifest["duration_s"] = round(time.monotonic() - started, 3)
    write_manifest(scratch, manifest)


def _run_step(step: BuildStep, log: Path, *, cwd: Path) -> dict[str, Any]:
    started = time.monotonic()
    record: dict[str, Any] = {"name": step.name, "command": list(step.argv) or None, "log": f"logs/{log.name}"}
    missing = [path for path in step.requires if not Path(path).exists()]
    with log.open("w") as handle:
        if missing:
            handle.write(f"missing: {', '.join(missing)}\n")
            record["returncode"] = 127
            record["missing"] = missing
        elif step.argv:
            env = {**os.environ, **step.env}
            try:
                completed = subprocess.run(step.argv, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT)
                record["returncode"] = completed.returncode
            except (FileNotFoundError, PermissionError) as exc:  # the program itself: not installed, not executable
                handle.write(f"cannot run {step.argv[0]}: {exc.strerror}\n")
                record["returncode"] = 127
                record["missing_program"] = step.argv[0]
                record["cannot_run"] = "not installed (not on PATH)" if "/" not in step.argv[0] else exc.strerror
        else:
            assert step.run is not None
            try:
                step.run(log)
                record["returncode"] = 0
            except Exception as exc:  # recorded and reported as a failed step
                handle.write(f"{type(exc).__name__}: {exc}\n")
                record["returncode"] = 1
    record["duration_s"] = round(time.monotonic() - started, 3)
    return record


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
