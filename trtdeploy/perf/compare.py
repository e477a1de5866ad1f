"""Perf runs side by side (``trtdeploy report``): each run folder's summary.json read and checked, one row per run
and level, the table as CSV and markdown, and plots with one line per run.

A run is any folder holding the summary.json that a :class:`~trtdeploy.perf.report.ReportWriter` wrote. The runs of
one report are of one workload family (LLM, TTS or ASR): their metrics differ, and mixing them is refused.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError, UsageError
from ..fsutil import atomic_write_text
from .report import (
    LATENCY_PNG,
    METRIC_NAMES,
    SUMMARY_JSON,
    THROUGHPUT_PNG,
    by_value,
    draw_plots,
    format_number,
    format_percent,
    level_axis,
    level_text,
    plotted,
    pyplot,
    save_figure,
    stat_of,
    warn_on_stderr,
    write_csv,
)
from .slo import Slo

if TYPE_CHECKING:
    from rich.table import Table

REPORT_JSON = "report.json"
#: A ``trtdeploy sweep`` folder's record of its points, where each measured point's run is (``run_dir``).
SWEEP_JSON = "sweep.json"
REPORT_CSV = "report.csv"
REPORT_MD = "report.md"
COMPLETE = "complete"


@dataclass(frozen=True)
class Metric:
    """One column of the comparison: its key in report.csv and ``--json``, its table header, how it is read from a
    level's summary and shown."""

    key: str
    header: str
    value: Callable[[dict[str, Any]], Any]
    text: Callable[[Any], str] = format_number


def _field(key: str, header: str) -> Metric:
    return Metric(key, header, lambda level: level[key])


def _stat(metric: str, stat: str, name: str | None = None) -> Metric:
    return Metric(f"{metric}_{stat}", f"{name or METRIC_NAMES[metric]} {stat}", lambda lv: stat_of(lv, metric, stat))


def _audio_rate(level: dict[str, Any]) -> float | None:
    return level["audio_seconds"] / level["duration_s"] if level["duration_s"] else None


@dataclass(frozen=True)
class Family:
    """What a report shows of one workload family: its throughput (the first plot's y, the second's x), its other
    numbers, and the latencies plotted against the throughput at two percentiles."""

    throughput: Metric
    throughput_label: str
    others: tuple[Metric, ...]
    latencies: tuple[str, ...]
    stats: tuple[str, str]
    #: The family's level keys the report reads (beside LEVEL_KEYS).
    keys: tuple[str, ...]

    @property
    def columns(self) -> tuple[Metric, ...]:
        latencies = tuple(_stat(metric, stat) for metric in self.latencies for stat in self.stats)
        return (self.throughput, *self.others, *latencies)


AUDIO_RATE = Metric("audio_seconds_per_second", "audio s/s", _audio_rate)
RTF = _field("rtf_aggregate", "RTF")
FAMILIES = {
    "llm": Family(
        throughput=_field("output_token_throughput", "out tok/s"),
        throughput_label="output tokens/s",
        others=(),
        latencies=("ttft_ms", "itl_ms", "e2e_ms"),
        stats=("p50", "p90"),
        keys=("output_token_throughput", "ttft_ms", "itl_ms", "e2e_ms"),
    ),
    "tts": Family(
        throughput=AUDIO_RATE,
        throughput_label="audio seconds per second",
        others=(RTF, _stat("rtf", "p95", "RTF")),
        latencies=("first_chunk_ms", "e2e_ms"),
        stats=("p50", "p95"),
        keys=("audio_seconds", "rtf_aggregate", "rtf", "first_chunk_ms", "e2e_ms"),
    ),
    "asr": Family(
        throughput=AUDIO_RATE,
        throughput_label="audio seconds per second",
        others=(RTF,),
        latencies=("first_partial_ms", "e2e_ms"),
        stats=("p50", "p95"),
        keys=("audio_seconds", "rtf_aggregate", "first_partial_ms", "e2e_ms"),
    ),
}
#: What the report reads of every summary, and of each of its levels (beside the family's keys): a summary.json
#: without them is of a format this version does not read.
SUMMARY_KEYS = ("model", "family", "stream", "status", "levels")
LEVEL_KEYS = (
    *("concurrency", "request_rate", "status", "requests", "errors", "request_throughput", "duration_s"),
    *("goodput", "attainment", "slo_met"),
)
LOAD_COLUMNS = (_field("requests", "requests"), _field("errors", "errors"), _field("request_throughput", "req/s"))
SLO_COLUMNS = (
    _field("goodput", "goodput"),
    Metric("attainment", "attainment", lambda level: level["attainment"], format_percent),
    Metric("slo_met", "SLO met", lambda level: level["slo_met"], lambda met: "-" if met is None else "✓✗"[not met]),
)


@dataclass(frozen=True)
class Run:
    """One run folder and its summary.json."""

    path: Path
    summary: dict[str, Any]
    #: The SLO the run was measured against (read from the summary once, when the run is read).
    slo: Slo | None = None

    @property
    def status(self) -> str:
        """``complete``, or how the run ended: interrupted, server_lost, failed, running (still, or killed)."""
        return str(self.summary["status"])

    @property
    def open_loop(self) -> bool:
        return any(level["request_rate"] is not None for level in self.summary["levels"])


def read_run(path: Path) -> Run:
    """The run in folder ``path``: NotFoundError when there is no such folder or no summary.json in it, UsageError
    when its summary.json is unreadable or of a format this version does not read."""
    if not path.is_dir():
        what = "is not a folder" if path.exists() else "does not exist"
        raise NotFoundError(f"run folder {path} {what}", hint="pass folders written by `trtdeploy perf`")
    summary_path = path / SUMMARY_JSON
    if not summary_path.is_file():
        what = "a `trtdeploy report` folder" if (path / REPORT_JSON).is_file() else "not a perf run"
        raise NotFoundError(
            f"{path} is {what}: it has no {SUMMARY_JSON}",
            hint="pass the folders that `trtdeploy perf` wrote (perf-results/<model>-<time>/)",
        )
    hint = f"compare runs written by this version's `trtdeploy perf`; rerun perf to compare {path}"
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{summary_path} is unreadable ({exc})", hint=hint) from None
    missing = _missing_keys(summary)
    if missing:
        raise UsageError(
            f"{summary_path} is not a perf summary this version reads: it has no {', '.join(missing)}", hint=hint
        )
    if not summary["levels"]:
        raise UsageError(f"{summary_path} has no measured level", hint="pass runs that measured at least one level")
    try:  # a damaged SLO is named here, before any report file is written
        slo = Slo.from_dict(summary["slo"]) if summary.get("slo") else None
    except (KeyError, TypeError, UsageError) as exc:
        raise UsageError(f"{summary_path} has an unreadable slo ({exc})", hint=hint) from None
    return Run(path, summary, slo)


def _missing_keys(summary: Any) -> list[str]:
    """The keys the report reads that ``summary`` lacks (``levels[i].key`` for a level's)."""
    if not isinstance(summary, dict):
        return ["JSON object"]
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        return missing
    family = FAMILIES.get(summary["family"]) if isinstance(summary["family"], str) else None
    if family is None or not isinstance(summary["levels"], list):
        return [f"known family (got {summary['family']!r})" if family is None else "list of levels"]
    for index, level in enumerate(summary["levels"]):
        lacking = [key for key in (*LEVEL_KEYS, *family.keys) if not isinstance(level, dict) or key not in level]
        if lacking:
            return [f"levels[{index}].{key}" for key in lacking]
    return []


def _label_parts(run: Run) -> tuple[str, list[str]]:
    """A run's label from its ``build`` (model, engine, precision, GPU) and the build's other parts that may tell it
    from a run with the same label; a run of an OpenAI-compatible server: its model, ``openai`` and who serves it
    (as its model list says, e.g. vllm), then its API and whether it streamed; a run of a remote Triton: its
    workload, the model loaded (when named otherwise) and the server's address, then its protocol and whether it
    streamed; any other run: its folder's name."""
    build, remote = run.summary.get("build"), run.summary.get("remote")
    if run.summary.get("endpoint") == "openai":
        base = " ".join(str(part) for part in (run.summary["model"], "openai", run.summary.get("served_by")) if part)
        return base, [str(run.summary.get("api") or ""), "streaming" if run.summary["stream"] else "offline"]
    if not build and isinstance(remote, dict) and remote.get("workload"):
        summary = run.summary
        workload, model, url = str(remote["workload"]), summary.get("model"), summary.get("url")
        base = workload if not model or model == workload else f"{workload} {model}"
        served = [str(summary.get("protocol") or ""), "streaming" if summary.get("stream") else "offline"]
        return f"{base} @ {url}" if url else base, served
    if not build:
        return run.path.name, []
    base = " ".join(str(build[key]) for key in ("model", "engine", "precision", "gpu") if build.get(key))

    def part(prefix: str, key: str) -> str:
        return "" if build.get(key) is None else f"{prefix}{build[key]}"

    others = [part("bs", "max_batch_size"), part("tp", "tp") + part("pp", "pp"), part("x", "replicas")]
    others += [part("", "mode"), part("", "engine_version")]
    return base or run.path.name, others


def default_labels(runs: Sequence[Run]) -> list[str]:
    """A label per run: the model, engine, precision and GPU profile of its ``build``, else its folder's name. Runs
    with the same label get the parts of their builds that tell them apart (max batch size, TP/PP, replicas, mode,
    engine version, then the build point's name), then the run folders as given."""
    bases, others = zip(*(_label_parts(run) for run in runs), strict=True)
    labels = list(bases)
    for base, count in Counter(bases).items():
        if count == 1:
            continue
        same = [index for index, each in enumerate(bases) if each == base]
        for part in range(max(len(others[index]) for index in same)):
            values = [others[index][part] if part < len(others[index]) else "" for index in same]
            if len(set(values)) > 1:
                for index, value in zip(same, values, strict=True):
                    labels[index] += f" {value}" if value else ""
    for label, count in Counter(labels).items():
        same = [index for index, each in enumerate(labels) if each == label]
        points = [str((runs[index].summary.get("build") or {}).get("point") or "") for index in same]
        # builds apart in a part not shown above (KV-cache dtype, calibration, ...): their point names tell them
        if count > 1 and len(set(points)) == count:
            for index, point in zip(same, points, strict=True):
                labels[index] = f"{label} {point}"
    for label, count in Counter(labels).items():
        if count > 1:
            for index in [index for index, each in enumerate(labels) if each == label]:
                labels[index] = f"{label} ({runs[index].path})"
    return labels


@dataclass(frozen=True)
class Comparison:
    """Runs of one family, each with its label, and the columns the report shows of every level."""

    family: str
    runs: tuple[Run, ...]
    labels: tuple[str, ...]

    @property
    def columns(self) -> tuple[Metric, ...]:
        slo = SLO_COLUMNS if any(run.slo is not None for run in self.runs) else ()
        return (*LOAD_COLUMNS, *FAMILIES[self.family].columns, *slo)

    def shown_label(self, index: int) -> str:
        """The label of run ``index`` as tables and legends show it: a run that did not complete says so."""
        run = self.runs[index]
        status = run.status
        return self.labels[index] if status == COMPLETE else f"{self.labels[index]} ({status.replace('_', ' ')})"

    def rows(self) -> list[dict[str, Any]]:
        """One row per run and level (the levels by concurrency or request rate): which run, which level, how
        each ended, and every column's value."""
        rows = []
        for run, label in zip(self.runs, self.labels, strict=True):
            for level in by_value(run.summary["levels"]):
                row = {"run": label, "path": str(run.path), "run_status": run.status}
                row.update(concurrency=level["concurrency"], request_rate=level["request_rate"])
                row["level_status"] = level["status"]
                row.update((metric.key, metric.value(level)) for metric in self.columns)
                rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The combined data: the runs (label, folder, status, what was loaded, the SLO) and the rows."""
        runs = [
            {
                "label": label,
                "path": str(run.path),
                "status": run.status,
                "model": run.summary["model"],
                "stream": run.summary["stream"],
                "build": run.summary.get("build"),
                "slo": run.summary.get("slo"),
            }
            for run, label in zip(self.runs, self.labels, strict=True)
        ]
        return {"family": self.family, "runs": runs, "rows": self.rows()}

    def cells(self) -> tuple[list[str], list[list[str]], list[str]]:
        """The table as text: its headers, its rows and the notes under it (console and markdown alike)."""
        closed = not any(run.open_loop for run in self.runs)
        opened = all(run.open_loop for run in self.runs)
        headers = ["run", "concurrency" if closed else "rate" if opened else "load"]
        headers += [metric.header for metric in self.columns]
        rows = []
        for index, run in enumerate(self.runs):
            for level in by_value(run.summary["levels"]):
                mark = "" if level["status"] == COMPLETE else "*"
                row = [self.shown_label(index), level_text(level) + mark]
                rows.append(row + [metric.text(metric.value(level)) for metric in self.columns])
        return headers, rows, self.notes()

    def notes(self) -> list[str]:
        notes = ["latencies in ms"]
        early = sorted({lv["status"] for run in self.runs for lv in run.summary["levels"] if lv["status"] != COMPLETE})
        if early:
            notes.append(f"* level ended early ({', '.join(status.replace('_', ' ') for status in early)})")
        ended = sorted({run.status.replace("_", " ") for run in self.runs if run.status != COMPLETE})
        if ended:
            notes.append(f"runs marked ({'), ('.join(ended)}) did not finish: the levels they measured")
        slos = {label: run.slo.describe() for run, label in zip(self.runs, self.labels, strict=True) if run.slo}
        if len(set(slos.values())) == 1:
            without = "" if len(slos) == len(self.runs) else " (runs without an SLO: -)"
            notes.append(f"SLO: {next(iter(slos.values()))}{without}")
        elif slos:
            notes.append("each run against its own SLO: " + "; ".join(f"{k}: {v}" for k, v in slos.items()))
        return notes


def run_folders(paths: Sequence[Path]) -> list[Path]:
    """``paths`` with each sweep folder among them replaced by the runs of its measured points, in its order."""
    folders = []
    for path in paths:
        record = path / SWEEP_JSON
        if (path / SUMMARY_JSON).is_file() or not record.is_file():
            folders.append(path)
            continue
        try:
            points = json.loads(record.read_text(encoding="utf-8"))["points"]
            runs = [path / point["run_dir"] for point in points if point["status"] in ("measured", "reused")]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{record} is unreadable ({exc})", hint="run the sweep again to rewrite it") from None
        if not runs:
            raise UsageError(f"the sweep in {path} has no measured point", hint="run the sweep again to measure them")
        folders += runs
    return folders


def compare(paths: Sequence[Path], labels: Sequence[str] | None = None) -> Comparison:
    """The runs in folders ``paths`` (a sweep's folder: its measured points' runs), in that order, labelled by
    ``labels`` (one per run) or :func:`default_labels`. UsageError for a folder given twice, labels that do not match
    the runs one to one, or runs of different workload families."""
    paths = run_folders(paths)
    resolved = [path.resolve() for path in paths]
    twice = next((path for path, count in Counter(resolved).items() if count > 1), None)
    if twice is not None:
        raise UsageError(f"{twice} is given twice", hint="pass each run folder once (a sweep's folder holds its runs)")
    runs = tuple(read_run(path) for path in paths)
    families = {run.summary["family"] for run in runs}
    if len(families) > 1:
        by_family = "; ".join(
            f"{family}: {', '.join(str(run.path) for run in runs if run.summary['family'] == family)}"
            for family in sorted(families)
        )
        raise UsageError(
            f"the runs measure different workload families ({by_family})",
            hint="report the runs of each family separately, e.g. `trtdeploy report LLM_RUN...` then "
            "`trtdeploy report TTS_RUN...`",
        )
    if labels:
        if len(labels) != len(runs):
            raise UsageError(
                f"{len(labels)} --label for {len(runs)} runs",
                hint="give one --label per run folder, in the same order, or none",
            )
        repeated = next((label for label, count in Counter(labels).items() if count > 1), None)
        if repeated is not None:
            raise UsageError(f"--label {repeated!r} is given to two runs", hint="give each run a label of its own")
    return Comparison(families.pop(), runs, tuple(labels) if labels else tuple(default_labels(runs)))


def comparison_table(comparison: Comparison) -> Table:
    """The console table: one section per run, one row per level."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    headers, rows, notes = comparison.cells()
    table = Table(title=f"{len(comparison.runs)} {comparison.family.upper()} runs", box=box.SIMPLE_HEAD)
    table.add_column(headers[0], justify="left")
    for header in headers[1:]:
        table.add_column(header, justify="right")
    previous = None
    for row in rows:
        if previous is not None and row[0] != previous:
            table.add_section()
        table.add_row(*(escape(cell) for cell in ([row[0]] if row[0] != previous else [""]) + row[1:]))
        previous = row[0]
    table.caption = escape("; ".join(notes))
    return table


def markdown(comparison: Comparison) -> str:
    """The table as markdown, its notes in a list below it."""
    return markdown_table(*comparison.cells())


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str]) -> str:
    """A markdown table (the first two columns left-aligned, the others right-aligned), ``notes`` listed below."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    align = ["---", "---", *["---:"] * (len(headers) - 2)]
    table = [line(headers), "| " + " | ".join(align) + " |", *(line(row) for row in rows)]
    listed = ["- " + note.replace("*", "\\*") for note in notes]
    return "\n".join([*table, "", *listed]) + "\n"


def run_colors(count: int) -> list[Any]:
    """A colour per run, all different: matplotlib's ten-colour cycle, or evenly spaced hues past ten runs."""
    if count <= 10:
        return [f"C{index}" for index in range(count)]
    from matplotlib import colormaps

    return [colormaps["turbo"](index / (count - 1)) for index in range(count)]


def write_plots(comparison: Comparison, output_dir: Path) -> list[Path]:
    """Overlaid plots, one line (one colour) per run: throughput against concurrency or request rate (a panel for
    each that the runs use), and each latency's two percentiles (solid, dashed) against throughput."""
    plt = pyplot()
    family = FAMILIES[comparison.family]
    runs = [(index, by_value(run.summary["levels"])) for index, run in enumerate(comparison.runs)]
    colors = run_colors(len(comparison.runs))
    kinds = sorted({run.open_loop for run in comparison.runs})
    figure, axes = plt.subplots(1, len(kinds), figsize=(7.5 * len(kinds), 4.8), squeeze=False)
    for axis, open_loop in zip(axes[0], kinds, strict=True):
        xs: set[float] = set()
        for index, levels in runs:
            if comparison.runs[index].open_loop != open_loop:
                continue
            values = [level["request_rate"] if open_loop else level["concurrency"] for level in levels]
            ys = [plotted(family.throughput.value(level)) for level in levels]
            axis.plot(values, ys, "-o", color=colors[index], label=comparison.shown_label(index))
            xs.update(values)
        x_label = "request rate (req/s)" if open_loop else "concurrency"
        axis.set(xlabel=x_label, ylabel=family.throughput_label, title=f"throughput against {x_label.split(' (')[0]}")
        level_axis(axis, sorted(xs), open_loop)
        axis.legend(fontsize="small")
    written = [save_figure(figure, output_dir / THROUGHPUT_PNG)]

    measured = [
        metric
        for metric in family.latencies
        if any(stat_of(level, metric, family.stats[0]) is not None for _, levels in runs for level in levels)
    ]
    if not measured:
        return written
    figure, axes = plt.subplots(1, len(measured), figsize=(6 * len(measured), 4.8), squeeze=False)
    solid, dashed = family.stats
    for axis, metric in zip(axes[0], measured, strict=True):
        for index, levels in runs:
            xs_run = [plotted(family.throughput.value(level)) for level in levels]
            for stat, style in ((solid, "-o"), (dashed, "--o")):
                ys = [plotted(stat_of(level, metric, stat)) for level in levels]
                label = comparison.shown_label(index) if stat == solid else None
                axis.plot(xs_run, ys, style, color=colors[index], label=label)
        title = f"{METRIC_NAMES[metric]}: {solid} solid, {dashed} dashed"
        axis.set(xlabel=family.throughput_label, ylabel="latency (ms)", title=title)
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    written.append(save_figure(figure, output_dir / LATENCY_PNG))
    return written


def write_report(
    comparison: Comparison, output_dir: Path, *, plots: bool = True, warn: Callable[[str], None] = warn_on_stderr
) -> list[Path]:
    """Write report.json (the combined data), report.csv (the rows), report.md (the table) and, asked and
    possible, the plots into ``output_dir`` (an existing folder); the files written."""
    data_path, csv_path, md_path = output_dir / REPORT_JSON, output_dir / REPORT_CSV, output_dir / REPORT_MD
    atomic_write_text(data_path, json.dumps(comparison.to_dict(), indent=2, default=str) + "\n")
    write_csv(csv_path, comparison.rows())
    atomic_write_text(md_path, markdown(comparison))
    written = [data_path, csv_path, md_path]
    if plots:
        written += draw_plots(lambda: write_plots(comparison, output_dir), warn)
    return written
