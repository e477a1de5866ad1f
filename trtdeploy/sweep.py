"""``trtdeploy sweep``: every point of a build matrix built (unless up to date), served, measured by ``perf`` and
stopped, one after another; then one report over all points (:mod:`trtdeploy.perf.pareto`).

A sweep folder holds ``sweep.json`` (the points: how each ended, why a failed one failed, where its run is),
``runs/<point>/<deployment hash>-<perf key>/`` (each point's perf run, as ``trtdeploy perf`` writes it) and the
report. A point's run is reused when a complete one exists for the same deployment hash (the build's inputs) and
perf key (the perf settings): a sweep run again measures only what it has not measured, and Ctrl-C keeps every
finished point's run. A point that cannot be planned, built, served or measured is recorded with its reason and the
sweep goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from . import build as builder
from .benchmark import PerfSettings, benchmark, check_for_workload, resolve_workload
from .errors import ExitCode, Interrupted, PerfError, TrtDeployError, UsageError
from .fsutil import atomic_write_text, prepare_output_dir
from .manifest import MANIFEST
from .matrix import plan_all
from .perf.compare import FAMILIES, SUMMARY_JSON, SWEEP_JSON, compare, markdown_table, write_report
from .perf.pareto import LATENCY_AXES, Level, best_level, levels_of, write_pareto_plot
from .perf.report import METRIC_NAMES, draw_plots, format_number, level_text, stat_of, warn_on_stderr
from .perf.runner import PerfRun, ProgressReporter, ServerLost
from .server import serve_deployment

SWEEP_MD = "sweep.md"
RUNS_DIR = "runs"

#: A point measured by this sweep, or by an earlier one (its run reused); the others' status says why they were not:
#: invalid, build_failed, serve_failed, perf_failed, server_lost, interrupted (or pending, not yet tried).
MEASURED, REUSED = "measured", "reused"


@dataclass(frozen=True)
class SweepSettings:
    """The matrix points, the perf settings every point is measured with (their deployment, URL and output folder
    are the sweep's to set), and where the sweep goes."""

    points: tuple[builder.BuildRequest, ...]
    perf: PerfSettings
    output_dir: Path
    force_build: bool = False
    serve_timeout: float = 180.0
    tritonserver: Path | None = None
    max_error_rate: float = 0.0


@dataclass
class Point:
    """One matrix point and how it ended."""

    label: str
    status: str = "pending"
    reason: str | None = None
    deployment: str | None = None
    deployment_hash: str | None = None
    gpus: int | None = None
    #: The point's perf run, relative to the sweep's folder.
    run_dir: str | None = None
    seconds: float | None = None
    #: The point's best level (:func:`describe_level`): the most throughput per GPU under the SLO, or of all its
    #: levels without one.
    best: dict[str, Any] | None = None
    #: With ``--find``: the highest concurrency or request rate that met the SLO (None: none did).
    found: float | None = None
    #: The exit code of what stopped a point that was not measured (as ``trtdeploy build``/``serve``/``perf`` exit).
    exit_code: int | None = None
    #: A measured point with more failed requests than --max-error-rate allows (``reason`` says where).
    error_rate_exceeded: bool = False

    @property
    def measured(self) -> bool:
        return self.status in (MEASURED, REUSED)


@dataclass
class Sweep:
    """A sweep's points and the report written over the measured ones."""

    output_dir: Path
    perf_key: str
    #: perf's --find, when each point searched for the most it holds under the SLO.
    find: str | None = None
    #: Whether the points were measured against an SLO.
    slo: bool = False
    points: list[Point] = field(default_factory=list)
    status: str = "running"
    best: dict[str, Any] | None = None
    family: str | None = None
    files: list[Path] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "perf_key": self.perf_key,
            "family": self.family,
            "find": self.find,
            "slo": self.slo,
            "points": [asdict(point) for point in self.points],
            "best": self.best,
        }

    def save(self) -> None:
        atomic_write_text(self.output_dir / SWEEP_JSON, json.dumps(self.to_dict(), indent=2, default=str) + "\n")


def perf_key(settings: PerfSettings) -> str:
    """A digest of what a point's measurement depends on besides its deployment: the load, the inputs (an input
    file by its size and modification time too), the request options, the SLO, the protocol and model loaded, and
    the ASR scorer."""
    inputs = asdict(settings.inputs)
    for name in ("input_data", "dataset"):  # a local file or folder: its contents' sizes and times too
        inputs[f"{name}_stamp"] = _stamp(Path(str(inputs[name]))) if inputs[name] is not None else None
    asr = settings.asr
    described = {
        "protocol": settings.protocol,
        "model": settings.model,
        "stream": settings.stream,
        "load": asdict(settings.load),
        "inputs": inputs,
        "options": asdict(settings.options),
        "slo": settings.slo.to_dict() if settings.slo is not None else None,
        "asr": None if asr is None else [asr.url, asr.model, asr.language],
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


def _stamp(path: Path) -> list[tuple[str, int, int]] | None:
    """Each file's (path, size, modification time) of a local file or folder (None: not a local path, a Hub name)."""
    if not path.exists():
        return None
    files = sorted(each for each in ([path] if path.is_file() else path.rglob("*")) if each.is_file())
    return [(str(each.relative_to(path)), each.stat().st_size, each.stat().st_mtime_ns) for each in files]


def _complete_run(base: Path, *, scored: bool) -> PerfRun | None:
    """The run in folder ``base`` (or ``base-N``) whose summary.json says it completed (and, ``scored``, that its
    speech was scored: a run cut during the scoring is complete without it)."""
    for folder in sorted(base.parent.glob(f"{base.name}*")):
        if folder.name != base.name and not folder.name[len(base.name) :].lstrip("-").isdigit():
            continue
        try:
            summary = json.loads((folder / SUMMARY_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict) and summary.get("status") == "complete" and (summary.get("asr") or not scored):
            return PerfRun(summary, output_dir=folder)
    return None


def _fresh_run_dir(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3`` ... if taken (by an earlier run that did not complete, kept as it is)."""
    folder, number = base, 1
    while folder.exists():
        number += 1
        folder = base.with_name(f"{base.name}-{number}")
    return folder


class _PointProgress:
    """The perf progress bars of one point, each labelled with the point."""

    def __init__(self, progress: ProgressReporter, prefix: str) -> None:
        self._progress, self._prefix = progress, prefix

    def start_level(self, label: str, total: int | None) -> None:
        self._progress.start_level(f"{self._prefix} {label}", total)

    def update(self, done: int, errors: int) -> None:
        self._progress.update(done, errors)

    def finish_level(self) -> None:
        self._progress.finish_level()


def run_sweep(
    settings: SweepSettings,
    *,
    say: Callable[[str], None],
    progress: ProgressReporter | None = None,
    warn: Callable[[str], None] = warn_on_stderr,
) -> Sweep:
    """Plan every point, then build, serve, measure and stop each in turn, saving sweep.json after each; then write
    the report. Ctrl-C stops the point under way (its server too) and raises Interrupted once the finished points'
    report is written. Perf options that the model cannot take (its workload's family decides) stop the sweep at
    its first point's build, before any server starts. Once the report is written: the exit code of the first
    point's failure when no point was measured, PerfError (exit 6) when a point had more failed requests than
    ``max_error_rate`` allows."""
    output_dir = settings.output_dir
    check_output_dir(output_dir)
    prepare_output_dir(output_dir)
    plans, rejected = plan_all(list(settings.points), skip_invalid=True)
    sweep = Sweep(output_dir, perf_key(settings.perf), find=settings.perf.load.find, slo=settings.perf.slo is not None)
    unique: dict[str, builder.Plan] = {}
    for found in plans:  # a value given twice in an axis: the same point, measured once
        unique.setdefault(found.point.name, found)
    planned = [Point(label=name, gpus=found.point.gpus_needed) for name, found in unique.items()]
    invalid = {item.label: item for item in rejected}
    sweep.points = planned + [
        Point(label=label, status="invalid", reason=item.reason, exit_code=int(item.error.exit_code))
        for label, item in invalid.items()
    ]
    for label, item in invalid.items():
        warn(f"point {label} cannot be built: {item.reason}")
    sweep.save()
    try:
        try:
            for number, (found, point) in enumerate(zip(unique.values(), planned, strict=True), 1):
                prefix = f"[{number}/{len(planned)}] {point.label}"
                _measure_point(settings, sweep, found, point, prefix, say, progress, warn)
                sweep.save()
        except TrtDeployError:  # what a point's own failure is not: perf options the model cannot take
            sweep.status = "failed"
            raise
        except KeyboardInterrupt:
            sweep.status = "interrupted"
            raise
        finally:
            if sweep.status != "running":
                _finish(sweep, settings, warn)
        sweep.status = "complete"
        _finish(sweep, settings, warn)
    except KeyboardInterrupt:
        sweep.status = "interrupted"
        sweep.save()
        done = sum(point.measured for point in sweep.points)
        raise Interrupted(
            f"{done} of {len(sweep.points)} points measured; their runs and the report are in {output_dir}",
            hint="run the same command again to measure the rest",
        ) from None
    _check_outcome(sweep)
    return sweep


def _check_outcome(sweep: Sweep) -> None:
    """Raise what a finished sweep exits with when it is not 0 (see :func:`run_sweep`)."""
    where = f"see each point in {sweep.output_dir / SWEEP_JSON}"
    if not any(point.measured for point in sweep.points):
        first = sweep.points[0]
        error = TrtDeployError(
            f"no point of the sweep could be measured (the first, {first.label}: {first.reason})", hint=where
        )
        error.exit_code = ExitCode(first.exit_code or ExitCode.INTERNAL)
        raise error
    over = [point for point in sweep.points if point.error_rate_exceeded]
    if over:
        raise PerfError(
            f"{len(over)} of {len(sweep.points)} points had more failed requests than --max-error-rate allows "
            f"(the first, {over[0].label}: {over[0].reason})",
            hint=where,
        )


def _measure_point(
    settings: SweepSettings,
    sweep: Sweep,
    found: builder.Plan,
    point: Point,
    prefix: str,
    say: Callable[[str], None],
    progress: ProgressReporter | None,
    warn: Callable[[str], None],
) -> None:
    """Build, serve and measure one point, recording in ``point`` how it ended (KeyboardInterrupt goes on up, the
    point marked interrupted, and so does the UsageError of perf options the model cannot take)."""
    started = datetime.now()

    def failed(status: str, exc: TrtDeployError) -> None:
        point.status, point.reason, point.exit_code = status, exc.message, int(exc.exit_code)
        warn(f"{prefix}: {status.replace('_', ' ')}: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""))

    try:
        say(f"{prefix}: build")
        try:
            result = builder.execute(found, force=settings.force_build, on_step=lambda text: say(f"{prefix}: {text}"))
        except TrtDeployError as exc:
            return failed("build_failed", exc)
        deployment = result.deployment
        point.deployment, point.deployment_hash = str(deployment.path), deployment.manifest["hash"]
        try:  # the same for every point of the model: the sweep stops here
            check_for_workload(settings.perf, resolve_workload(deployment, settings.perf.model))
        except UsageError as exc:
            failed("perf_failed", exc)
            raise
        base = sweep.output_dir / RUNS_DIR / point.label / f"{point.deployment_hash[:12]}-{sweep.perf_key[:12]}"
        done = _complete_run(base, scored=settings.perf.asr is not None)
        if done is not None and done.output_dir is not None:
            point.status, point.run_dir = REUSED, str(done.output_dir.relative_to(sweep.output_dir))
            say(f"{prefix}: measured before with the same deployment and perf settings: {done.output_dir}")
            _check_error_rate(done, settings, point, prefix, warn)
            return None
        run_dir = _fresh_run_dir(base)
        say(f"{prefix}: serve")
        try:
            server, _ = serve_deployment(deployment, timeout=settings.serve_timeout, tritonserver=settings.tritonserver)
        except TrtDeployError as exc:
            return failed("serve_failed", exc)
        with server:
            perf = replace(
                settings.perf,
                deployment=deployment.path,
                url=server.grpc_url if settings.perf.protocol == "grpc" else server.http_url,
                metrics_url=server.metrics_url,
                output_dir=run_dir,
            )
            say(f"{prefix}: perf against {perf.url}")
            point.run_dir = str(run_dir.relative_to(sweep.output_dir))
            try:
                run = benchmark(perf, progress=_PointProgress(progress, prefix) if progress else None, warn=warn)
            except Interrupted:
                raise KeyboardInterrupt from None
            except ServerLost as exc:
                return failed("server_lost", exc)
            except TrtDeployError as exc:
                return failed("perf_failed", exc)
        point.status = MEASURED
        _check_error_rate(run, settings, point, prefix, warn)
        return None
    except KeyboardInterrupt:
        point.status = "interrupted"
        raise
    finally:
        if point.run_dir is not None and not (sweep.output_dir / point.run_dir).exists():
            point.run_dir = None  # perf wrote nothing (refused before its first level)
        point.seconds = round((datetime.now() - started).total_seconds(), 1)


def _check_error_rate(
    run: PerfRun, settings: SweepSettings, point: Point, prefix: str, warn: Callable[[str], None]
) -> None:
    """Flag ``point`` when its run had more failed requests than ``settings.max_error_rate`` allows."""
    try:
        run.check_error_rate(settings.max_error_rate)
    except PerfError as exc:
        point.reason, point.error_rate_exceeded = exc.message, True
        warn(f"{prefix}: {exc.message}")


def _finish(sweep: Sweep, settings: SweepSettings, warn: Callable[[str], None]) -> None:
    """Write the report over the measured points (the comparison of their runs, the Pareto plot, sweep.md) and the
    final sweep.json."""
    measured = [point for point in sweep.points if point.measured]
    if measured:
        comparison = compare([sweep.output_dir / str(point.run_dir) for point in measured], [p.label for p in measured])
        sweep.family = comparison.family
        levels = levels_of(comparison, [point.gpus or 1 for point in measured])
        for index, (point, run) in enumerate(zip(measured, comparison.runs, strict=True)):
            own = best_level([level for level in levels if level.run == index], slo=sweep.slo)
            point.best = None if own is None else describe_level(comparison.family, own)
            point.found = (run.summary.get("search") or {}).get("found")
        best = best_level(levels, slo=sweep.slo)
        sweep.best = None
        if best is not None:
            label = measured[best.run].label
            sweep.best = {"point": label, "under_slo": sweep.slo, **describe_level(comparison.family, best)}
        sweep.files = write_report(comparison, sweep.output_dir, plots=settings.perf.plots, warn=warn)
        if settings.perf.plots:
            sweep.files += draw_plots(
                lambda: [write_pareto_plot(comparison, levels, best, sweep.output_dir, slo=sweep.slo)], warn
            )
    markdown = sweep.output_dir / SWEEP_MD
    atomic_write_text(markdown, markdown_table(*points_table(sweep)))
    sweep.files.append(markdown)
    sweep.save()


def describe_level(family: str, level: Level) -> dict[str, Any]:
    """A level as sweep.json and the points table give it: where it ran, its throughput per GPU, its latencies."""
    summary = level.summary
    return {
        "concurrency": summary["concurrency"],
        "request_rate": summary["request_rate"],
        "throughput_per_gpu": level.throughput_per_gpu,
        **{f"{metric}_{stat}": stat_of(summary, metric, stat) for metric, stat in LATENCY_AXES[family]},
    }


def points_table(sweep: Sweep) -> tuple[list[str], list[list[str]], list[str]]:
    """The points as a table (headers, rows, notes): how each ended, its best level and that level's figures."""
    family = sweep.family or "llm"
    axes = LATENCY_AXES[family]
    searched = sweep.find is not None
    headers = ["point", "status", "GPUs", "best level", f"{FAMILIES[family].throughput.header} per GPU"]
    headers += [f"{METRIC_NAMES[metric]} {stat}" for metric, stat in axes]
    headers += [f"{sweep.find} under SLO"] * searched + ["note"]
    rows = []
    for point in sweep.points:
        best = point.best or {}
        where = "-" if not best else level_text(best)
        row = [point.label, point.status.replace("_", " "), format_number(point.gpus), where]
        row += [format_number(best.get("throughput_per_gpu"))]
        row += [format_number(best.get(f"{metric}_{stat}")) for metric, stat in axes]
        row += [format_number(point.found)] * searched + [point.reason or ""]
        rows.append(row)
    notes = ["latencies in ms" if family == "llm" else "latencies in ms, RTF without a unit"]
    if sweep.best is not None:
        best = sweep.best
        under = "under the SLO" if best["under_slo"] else "of all levels (no SLO given)"
        per_gpu = format_number(best["throughput_per_gpu"])
        notes.append(f"best {under}: {best['point']} at {level_text(best)}, {per_gpu} per GPU")
    elif sweep.slo and any(point.measured for point in sweep.points):
        notes.append("best: none (no level met the SLO)")
    return headers, rows, notes


def check_output_dir(output_dir: Path) -> None:
    """Refuse a sweep folder that is a perf run's or a deployment's (its files would be mixed with theirs)."""
    for name, what in ((SUMMARY_JSON, "a perf run"), (MANIFEST, "a deployment")):
        if (output_dir / name).is_file():
            raise UsageError(f"--output-dir {output_dir} is {what}", hint="pass another folder for the sweep")
