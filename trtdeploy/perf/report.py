"""What a run shows and writes: a live progress bar, a console table, summary.json/.csv, requests.jsonl, plots,
and the generated audio (TTS)."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import time
import wave
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..fsutil import atomic_write_text
from .metrics import DEFINITIONS
from .slo import Slo

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from .loadgen import Level
    from .records import Record

SUMMARY_JSON = "summary.json"
SUMMARY_CSV = "summary.csv"
REQUESTS_JSONL = "requests.jsonl"
LATENCY_PNG = "latency.png"
THROUGHPUT_PNG = "throughput.png"
AUDIO_DIR = "audio"
#: Client CPU utilization from which the table warns that the client may have been the bottleneck.
CLIENT_BUSY = 0.9


class LiveProgress:
    """One progress bar per level on ``console`` (stderr), kept after the level ends. A context manager."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[errors]} failed[/]"),
            TimeElapsedColumn(),
            console=console,
            refresh_per_second=4,  # the bar is redrawn in a thread: keep it from taking the client's core
        )
        self._task: Any = None

    def __enter__(self) -> LiveProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def start_level(self, label: str, total: int | None) -> None:
        self._task = self._progress.add_task(label, total=total, errors=0)

    def update(self, done: int, errors: int) -> None:
        self._progress.update(self._task, completed=done, errors=errors)

    def finish_level(self) -> None:
        self._progress.refresh()


def format_number(value: Any) -> str:
    """A compact number: 3 significant digits up to 100, thousands separators beyond."""
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def format_percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


METRIC_NAMES = {
    "first_chunk_ms": "1st chunk",
    "first_partial_ms": "1st partial",
    "ttft_ms": "TTFT",
    "itl_ms": "ITL",
    "e2e_ms": "E2E",
    "rtf": "RTF",
}
#: Latencies shown per family, streamed and offline.
_LATENCIES = {
    "tts": (("first_chunk_ms", "e2e_ms"), ("e2e_ms",)),
    "asr": (("first_partial_ms", "e2e_ms"), ("e2e_ms",)),
    "llm": (("ttft_ms", "itl_ms", "e2e_ms"), ("e2e_ms",)),
}


def stat_of(summary: dict[str, Any], metric: str, key: str) -> Any:
    stats = summary.get(metric)
    return stats[key] if stats else None


def level_text(level: dict[str, Any]) -> str:
    return str(level["concurrency"]) if level["request_rate"] is None else f"{level['request_rate']:g}/s"


def level_value(level: dict[str, Any]) -> float:
    """A level's concurrency, or its request rate in open loop."""
    return level["concurrency"] if level["request_rate"] is None else level["request_rate"]


def by_value(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The levels by concurrency or request rate (a search runs them in another order)."""
    return sorted(levels, key=level_value)


def _has_scores(level: dict[str, Any]) -> bool:
    """Whether the level has WER/CER: TTS speech transcribed (``--asr``), or ASR transcripts with references."""
    scores = level.get("asr")
    return bool(scores) and scores.get("scored", 1) > 0


def _pair(level: dict[str, Any], metric: str, first: str, second: str) -> str:
    """``p50/p99`` of a metric as the table shows it."""
    return f"{format_number(stat_of(level, metric, first))}/{format_number(stat_of(level, metric, second))}"


def results_table(summary: dict[str, Any]) -> Table:
    """The console table of a run: one row per level, by concurrency or rate; latencies as p50/p99 in ms."""
    from rich import box
    from rich.table import Table

    levels = by_value(summary["levels"])
    found = (summary.get("search") or {}).get("level")
    open_loop = any(level["request_rate"] is not None for level in levels)
    family = summary["family"]
    audio = family in ("tts", "asr")  # latencies per second of audio: RTF instead of token throughput
    mode = "streaming" if summary["stream"] else "offline"
    title = f"{summary['model']} ({mode}, {summary['protocol']})"
    remote = summary.get("remote")
    if remote:  # a server with no deployment folder here: the workload it was loaded with
        title += f" at {summary['url']}, {remote['workload']} workload"
    table = Table(title=title, box=box.SIMPLE_HEAD)
    metrics = _LATENCIES.get(family, _LATENCIES["llm"])[0 if summary["stream"] else 1]
    columns = ["rate" if open_loop else "concurrency", "requests", "errors", "req/s", "RTF" if audio else "out tok/s"]
    if family == "asr":
        columns.append("audio s/s")
    if family == "tts":
        columns.append("chars/s")
    columns += [f"{METRIC_NAMES[metric]} p50/p99" for metric in metrics]
    if summary["stream"]:
        columns.append("ICL p99/max")  # a stalled stream shows here even when ITL averages it away
    columns.append("goodput")
    slo = Slo.from_dict(summary["slo"]) if summary.get("slo") else None
    if slo is not None:
        columns.append("SLO")
    # WER/CER: seed-tts-eval's mean per utterance for TTS, the corpus rate for ASR
    rate = "corpus" if family == "asr" else "mean"
    scored = any(_has_scores(level) for level in levels)
    if audio:
        columns.insert(columns.index("goodput"), "E2E avg")
    if scored:
        columns += ["WER", "CER"]
    for name in columns:
        table.add_column(name, justify="right")
    for level in levels:
        ended_early = level.get("status", "complete") != "complete"
        label = level_text(level) + ("*" if ended_early else "")
        row = [label, str(level["requests"]), str(level["errors"]), format_number(level["request_throughput"])]
        row.append(format_number(level["rtf_aggregate"] if audio else level["output_token_throughput"]))
        if family == "asr":
            row.append(format_number(level["audio_seconds_per_second"]))
        if family == "tts":
            row.append(format_number(level.get("characters_per_second")))
        row += [_pair(level, metric, "p50", "p99") for metric in metrics]
        if summary["stream"]:
            row.append(_pair(level, "icl_ms", "p99", "max"))
        if audio:
            row.append(format_number(stat_of(level, "e2e_ms", "mean")))
        row.append(format_number(level["goodput"]))
        if slo is not None:
            row.append(f"{format_percent(level['attainment'])} {'✓' if level['slo_met'] else '✗'}")
        if scored:
            scores = level.get("asr") or {}
            row += [format_percent(scores.get(f"wer_{rate}")), format_percent(scores.get(f"cer_{rate}"))]
        table.add_row(*row, style="red" if level["errors"] else "bold" if level["level"] == found else None)
    notes = ["latencies in ms"]
    early = sorted({level["status"] for level in levels if level.get("status", "complete") != "complete"})
    if early:
        notes.append(f"[red]* ended early: {', '.join(status.replace('_', ' ') for status in early)}[/]")
    if family == "llm" and levels and levels[0].get("token_source"):
        notes.append(f"tokens: {levels[0]['token_source']}")
    if scored and family == "tts":
        notes.append("WER/CER: mean per utterance (seed-tts-eval)")
    elif scored:
        notes.append("WER/CER: corpus rates, Whisper's normalisers")
    elif family == "asr":
        notes.append("no WER/CER: the inputs have no reference transcripts")
    if slo is not None:
        meeting = ", ".join(map(str, slo.per_request)) or "no per-request limit (successful requests)"
        notes.append(f"goodput: req/s meeting {meeting}; SLO: their share, ✓ for {slo.describe()}")
    if found is not None:
        notes.append("bold: the level --find found")
    if any((level["client_cpu_utilization"] or 0) >= CLIENT_BUSY for level in levels):
        notes.append(
            f"[yellow]a client process was >= {CLIENT_BUSY:.0%} busy: results may be client-bound (--workers)[/]"
        )
    table.caption = "; ".join(notes)
    return table


def search_result(summary: dict[str, Any]) -> str | None:
    """One line on what ``--find`` found (None for a run without a search)."""
    search = summary.get("search")
    if not search:
        return None
    concurrency = search["find"] == "max-concurrency"
    what, unit = ("max concurrency", "") if concurrency else ("max request rate", "/s")
    slo = Slo.from_dict(summary["slo"]).describe()
    runs = f"{search['levels_run']} levels run"
    if search["found"] is None:
        return f"{what} meeting {slo}: none (down to {search['lowest_failed']:g}{unit}, no level met it; {runs})"
    level = summary["levels"][search["level"]]
    line = (
        f"{what} meeting {slo}: {search['found']:g}{unit} (attainment {format_percent(level['attainment'])}, "
        f"{format_number(level['request_throughput'])} req/s"
    )
    if search["lowest_failed"] is not None:
        return f"{line}; {search['lowest_failed']:g}{unit} missed it; {runs})"
    return f"{line}; every level met it up to the search's ceiling, so the most may be higher; {runs})"


def print_table(console: Console, summary: dict[str, Any]) -> None:
    """Print the results table of a run."""
    print_wide(console, results_table(summary))


def print_wide(console: Console, table: Table) -> None:
    """Print ``table``: fitted to a terminal, at its natural width into a file or pipe."""
    if console.is_terminal:
        console.print(table)
        return
    width = console.width
    console.width = max(width, console.measure(table, options=console.options.update_width(10_000)).maximum)
    try:
        console.print(table)
    finally:
        console.width = width


def _flatten(level: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: scalars as they are, statistics as ``<metric>_<stat>``, server averages of each model."""
    row: dict[str, Any] = {}
    for key, value in level.items():
        if key in ("server", "error_messages"):
            continue
        if isinstance(value, dict):
            for sub, item in value.items():
                if not isinstance(item, dict):
                    row[f"{key}_{sub}"] = item
        elif value is not None:
            row[key] = value
    for model, stats in (level.get("server") or {}).get("models", {}).items():
        for key, value in stats.items():
            row[f"server_{model}_{key}"] = value
    return row


def default_output_dir(name: str) -> Path:
    """``perf-results/<name>-<time>``: where a run or a report goes unless told."""
    return Path("perf-results") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def write_csv(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """The rows as CSV (the columns of all of them, in order of appearance), written atomically."""
    rows = list(rows)
    fields: list[str] = []
    for row in rows:
        fields.extend(key for key in row if key not in fields)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())


def request_row(
    rec: Record, level: Level, metrics: dict[str, Any] | None, *, family: str, origin_ns: int
) -> dict[str, Any]:
    """The ``requests.jsonl`` row of one request (warmup and failed ones too): its level, times and ``metrics``
    (:func:`~trtdeploy.perf.metrics.request_metrics`; None for a failed request).

    ``start_ms`` is its send time in ms after ``origin_ns`` (the start of the run).
    """
    row: dict[str, Any] = {
        "level": level.index,
        "concurrency": level.concurrency,
        "request_rate": level.request_rate,
        "worker": rec.worker,
        "seq": rec.seq,
        "row": rec.row,
        "warmup": rec.warmup,
        "start_ms": (rec.send_ns - origin_ns) / 1e6,
        "error": rec.error,
    }
    if rec.scheduled_ns is not None:
        row["lag_ms"] = (rec.send_ns - rec.scheduled_ns) / 1e6
    if metrics is not None:
        row.update((key, value) for key, value in metrics.items() if key != "icl_ms")
        row["chunk_ms"] = [(t - rec.send_ns) / 1e6 for t in rec.chunk_ns]
        row["chunk_tokens"] = rec.chunk_tokens
        if family == "tts":
            row["chunk_audio_seconds"] = rec.chunk_audio
        if rec.accuracy is not None:
            row["asr"] = rec.accuracy
        row.update(
            input_tokens=rec.input_tokens,
            output_tokens=rec.output_tokens,
            first_chunk_tokens=rec.first_chunk_tokens,
            token_source=rec.token_source,
            text=rec.text,
        )
        if rec.scores:
            row["scores"] = rec.scores
    else:
        row["e2e_ms"] = (rec.end_ns - rec.send_ns) / 1e6
    if rec.reference is not None:
        row["reference"] = rec.reference
    return row


def level_folder(concurrency: int | None, request_rate: float | None) -> str:
    """``c4`` for concurrency 4, ``rate2.5`` for 2.5 requests/s."""
    return f"c{concurrency}" if request_rate is None else f"rate{request_rate:g}"


def write_wav(path: Path, samples: Any, sample_rate: int) -> None:
    """16-bit PCM mono WAV of float samples in [-1, 1] (clipped)."""
    import numpy as np

    pcm = (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(sample_rate)
        fh.writeframes(pcm.tobytes())


def read_wav(path: Path) -> tuple[Any, int]:
    """Float samples in [-1, 1] and the rate of a 16-bit PCM mono WAV (as :func:`write_wav` writes them)."""
    import numpy as np

    with wave.open(str(path), "rb") as fh:
        rate, frames = fh.getframerate(), fh.readframes(fh.getnframes())
    return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32767.0, rate


def pyplot() -> Any:
    """matplotlib's pyplot drawing into files only (the Agg backend; no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: Path) -> Path:
    """Write ``figure`` to ``path`` as a PNG and free it."""
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot().close(figure)
    return path


def plotted(value: float | None) -> float:
    """A value as a line plot takes it: a missing one is NaN, a gap in the line."""
    return float("nan") if value is None else value


def level_axis(axis: Any, xs: list[float], open_loop: bool) -> None:
    """Ticks at the levels; concurrency on a log2 scale (levels usually double)."""
    if not open_loop and len(xs) > 1:
        axis.set_xscale("log", base=2)
    axis.set_xticks(xs, [f"{x:g}" for x in xs])
    axis.grid(alpha=0.3)


def write_plots(summary: dict[str, Any], output_dir: Path) -> list[Path]:
    """Latency (p50 and p99) and throughput against the level's concurrency or request rate."""
    plt = pyplot()
    levels = by_value(summary["levels"])
    open_loop = any(level["request_rate"] is not None for level in levels)
    xs = [level["request_rate"] if open_loop else level["concurrency"] for level in levels]
    x_label = "request rate (req/s)" if open_loop else "concurrency"
    metrics = _LATENCIES.get(summary["family"], _LATENCIES["llm"])[0]

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for metric in metrics:
        for stat, style in (("p50", "-o"), ("p99", "--o")):
            ys = [stat_of(level, metric, stat) for level in levels]
            if any(y is not None for y in ys):
                axis.plot(xs, [plotted(y) for y in ys], style, label=f"{METRIC_NAMES[metric]} {stat}")
    axis.set(xlabel=x_label, ylabel="latency (ms)", title=f"{summary['model']}: latency")
    level_axis(axis, xs, open_loop)
    axis.legend()
    latency = save_figure(figure, output_dir / LATENCY_PNG)

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    left.plot(xs, [level["request_throughput"] or 0 for level in levels], "-o", label="requests/s")
    if summary.get("slo"):
        left.plot(xs, [level["goodput"] or 0 for level in levels], "--o", label="goodput")
    left.set(xlabel=x_label, ylabel="requests/s", title="request throughput")
    left.legend()
    if summary["family"] in ("tts", "asr"):
        right.plot(xs, [level["rtf_aggregate"] or 0 for level in levels], "-o")
        right.set(xlabel=x_label, ylabel="RTF (lower is better)", title="aggregate RTF")
    else:
        right.plot(xs, [level["output_token_throughput"] or 0 for level in levels], "-o", label="output")
        right.plot(xs, [level["input_token_throughput"] or 0 for level in levels], "--o", label="input")
        right.set(xlabel=x_label, ylabel="tokens/s", title="token throughput")
        right.legend()
    for axis in (left, right):
        level_axis(axis, xs, open_loop)
    return [latency, save_figure(figure, output_dir / THROUGHPUT_PNG)]


def warn_on_stderr(message: str) -> None:
    """The default way a report warning reaches the user: one line on stderr."""
    sys.stderr.write(f"Warning: {message}\n")
    sys.stderr.flush()


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def draw_plots(draw: Callable[[], list[Path]], warn: Callable[[str], None]) -> list[Path]:
    """The plot files that ``draw`` writes. The plots come after the other reports, and a failure there (matplotlib
    missing, a plotting error) costs only the plots: it is passed to ``warn`` as one line."""
    try:
        return draw()
    except ImportError as exc:
        warn(
            f"plots skipped: matplotlib cannot be imported ({_one_line(exc)}); "
            "install it with `pip install 'trtdeploy[perf]'`, or pass --no-plots"
        )
    except Exception as exc:
        warn(f"plots skipped: {_one_line(exc)} (the other reports are written)")
    return []


class ReportWriter:
    """Writes a run's reports as it goes: every record to ``requests.jsonl`` (and its audio) as it completes, the
    summary files after every level, the plots at the end. A :class:`~trtdeploy.perf.runner.RunObserver`.

    Whatever ends the run (the server lost, Ctrl-C), :meth:`finish` leaves complete files for what was measured.
    """

    def __init__(self, output_dir: Path, *, plots: bool = True, warn: Callable[[str], None] = warn_on_stderr) -> None:
        self.output_dir = output_dir
        self.plots = plots
        self.warn = warn
        self.header: dict[str, Any] = {}
        self.levels: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self._requests: IO[str] | None = None
        self._origin_ns = 0
        self._unflushed = False
        self._audio_names: dict[int, set[str]] = {}

    @property
    def requests_path(self) -> Path:
        return self.output_dir / REQUESTS_JSONL

    def summary(self, status: str) -> dict[str, Any]:
        """summary.json: what the run was, its status, every level so far, and what each number means."""
        return {**self.header, **self.extra, "status": status, "levels": self.levels, "definitions": DEFINITIONS}

    def started(self, header: dict[str, Any]) -> None:
        self.header = {**self.header, **header}
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._requests = open(self.requests_path, "w", encoding="utf-8")  # noqa: SIM115 - closed by finish()
        self._origin_ns = time.perf_counter_ns()

    def record(self, rec: Record, level: Level, metrics: dict[str, Any] | None) -> None:
        assert self._requests is not None, "started() comes first"
        row = request_row(rec, level, metrics, family=self.header["family"], origin_ns=self._origin_ns)
        if rec.audio is not None and rec.sample_rate is not None:
            path = self._audio_path(rec, level)
            write_wav(self.output_dir / path, rec.audio, rec.sample_rate)
            row["audio_file"] = path.as_posix()
        self._requests.write(json.dumps(row, default=str) + "\n")
        self._unflushed = True

    def _audio_path(self, rec: Record, level: Level) -> Path:
        """``audio/<level>/<label>.wav``, unique within the level (relative to the output folder)."""
        taken = self._audio_names.setdefault(level.index, set())
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", rec.label or "")[:100].strip("._") or f"row{rec.row:05d}"
        if name in taken:
            name = f"{name}-row{rec.row:05d}"
        taken.add(name)
        return Path(AUDIO_DIR) / level_folder(level.concurrency, level.request_rate) / f"{name}.wav"

    def flush(self) -> None:
        """Write the buffered records to requests.jsonl (the engine calls this a few times a second)."""
        if self._requests is not None and self._unflushed:
            self._requests.flush()
            self._unflushed = False

    def level_done(self, summary: dict[str, Any]) -> None:
        self.levels.append(summary)
        self.flush()
        self.write_summary("running")

    def write_summary(self, status: str) -> list[Path]:
        """Write summary.json and summary.csv as the run stands."""
        summary_json, summary_csv = self.output_dir / SUMMARY_JSON, self.output_dir / SUMMARY_CSV
        atomic_write_text(summary_json, json.dumps(self.summary(status), indent=2, default=str) + "\n")
        write_csv(summary_csv, (_flatten(level) for level in self.levels))
        return [summary_json, summary_csv]

    def discard(self) -> None:
        """Close and remove requests.jsonl (a run that ended before any level started: nothing to keep)."""
        if self._requests is not None:
            self._requests.close()
            self._requests = None
            self.requests_path.unlink(missing_ok=True)

    def finish(self, status: str = "complete") -> list[Path]:
        """Close requests.jsonl, write the summary files with ``status`` and (asked and possible) the plots
        (:func:`draw_plots`)."""
        if self._requests is not None:
            self._requests.close()
            self._requests = None
        written = [*self.write_summary(status), self.requests_path]
        written += sorted(self.output_dir.glob(f"{AUDIO_DIR}/*/*.wav"))
        if self.plots and self.levels:
            written += draw_plots(lambda: write_plots(self.summary(status), self.output_dir), self.warn)
        return written
