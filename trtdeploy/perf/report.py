"""What a run shows and writes: a live progress bar, a console table, summary.json/.csv, requests.jsonl, plots,
and the generated audio (TTS)."""

from __future__ import annotations

import csv
import json
import re
import sys
import wave
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .metrics import request_metrics

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from .runner import PerfRun

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

    def start_level(self, label: str, total: int) -> None:
        self._task = self._progress.add_task(label, total=total, errors=0)

    def update(self, done: int, errors: int) -> None:
        self._progress.update(self._task, completed=done, errors=errors)

    def finish_level(self) -> None:
        self._progress.refresh()


def _num(value: Any) -> str:
    """A compact number: 3 significant digits up to 100, thousands separators beyond."""
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


_NAMES = {"first_chunk_ms": "1st chunk", "ttft_ms": "TTFT", "itl_ms": "ITL", "e2e_ms": "E2E"}


def _stat(summary: dict[str, Any], metric: str, key: str) -> Any:
    stats = summary.get(metric)
    return stats[key] if stats else None


def _x_label(level: dict[str, Any]) -> str:
    return str(level["concurrency"]) if level["request_rate"] is None else f"{level['request_rate']:g}/s"


def results_table(summary: dict[str, Any]) -> Table:
    """The console table of a run: one row per level; latencies as p50/p99 in ms."""
    from rich import box
    from rich.table import Table

    levels = summary["levels"]
    open_loop = any(level["request_rate"] is not None for level in levels)
    tts = summary["family"] == "tts"
    mode = "streaming" if summary["stream"] else "offline"
    table = Table(title=f"{summary['model']} ({mode}, {summary['protocol']})", box=box.SIMPLE_HEAD)
    if tts:
        metrics = ("first_chunk_ms", "e2e_ms") if summary["stream"] else ("e2e_ms",)
    else:
        metrics = ("ttft_ms", "itl_ms", "e2e_ms") if summary["stream"] else ("e2e_ms",)
    columns = ["rate" if open_loop else "concurrency", "requests", "errors", "req/s", "RTF" if tts else "out tok/s"]
    columns += [f"{_NAMES[metric]} p50/p99" for metric in metrics] + ["goodput"]
    asr = tts and any(level.get("asr") for level in levels)
    if tts:
        columns.insert(columns.index("goodput"), "E2E avg")
    if asr:
        columns += ["WER", "CER"]
    for name in columns:
        table.add_column(name, justify="right")
    for level in levels:
        row = [_x_label(level), str(level["requests"]), str(level["errors"]), _num(level["request_throughput"])]
        row.append(_num(level["rtf_aggregate"] if tts else level["output_token_throughput"]))
        row += [f"{_num(_stat(level, m, 'p50'))}/{_num(_stat(level, m, 'p99'))}" for m in metrics]
        if tts:
            row.append(_num(_stat(level, "e2e_ms", "mean")))
        row.append(_num(level["goodput"]))
        if asr:
            scores = level.get("asr") or {}
            row += [_percent(scores.get("wer_mean")), _percent(scores.get("cer_mean"))]
        table.add_row(*row, style="red" if level["errors"] else None)
    notes = ["latencies in ms"]
    if not tts and levels and levels[0].get("token_source"):
        notes.append(f"tokens: {levels[0]['token_source']}")
    if asr:
        notes.append("WER/CER: mean per utterance (seed-tts-eval)")
    if summary.get("slo"):
        notes.append("goodput: req/s meeting " + ", ".join(f"{k}<={v:g}" for k, v in summary["slo"].items()))
    if any((level["client_cpu_utilization"] or 0) >= CLIENT_BUSY for level in levels):
        notes.append(
            f"[yellow]a client process was >= {CLIENT_BUSY:.0%} busy: results may be client-bound (--workers)[/]"
        )
    table.caption = "; ".join(notes)
    return table


def print_table(console: Console, summary: dict[str, Any]) -> None:
    """Print the results table: fitted to a terminal, at its natural width into a file or pipe."""
    table = results_table(summary)
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


def write_csv(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    rows = list(rows)
    fields: list[str] = []
    for row in rows:
        fields.extend(key for key in row if key not in fields)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def request_rows(run: PerfRun) -> Iterable[dict[str, Any]]:
    """``requests.jsonl`` rows: every request (warmup and failed ones too) with its level and metrics."""
    summary = run.summary
    levels = {level["level"]: level for level in summary["levels"]}
    starts: dict[int, int] = {}
    for rec in run.records:
        starts[rec.level] = min(starts.get(rec.level, rec.send_ns), rec.send_ns)
    for rec in run.records:
        level = levels[rec.level]
        row: dict[str, Any] = {
            "level": rec.level,
            "concurrency": level["concurrency"],
            "request_rate": level["request_rate"],
            "worker": rec.worker,
            "seq": rec.seq,
            "row": rec.row,
            "warmup": rec.warmup,
            "start_ms": (rec.send_ns - starts[rec.level]) / 1e6,
            "error": rec.error,
        }
        if rec.scheduled_ns is not None:
            row["lag_ms"] = (rec.send_ns - rec.scheduled_ns) / 1e6
        if rec.error is None:
            metrics = request_metrics(rec, stream=summary["stream"], family=summary["family"])
            metrics.pop("icl_ms")
            row.update(metrics)
            row["chunk_ms"] = [(t - rec.send_ns) / 1e6 for t in rec.chunk_ns]
            row["chunk_tokens"] = rec.chunk_tokens
            if summary["family"] == "tts":
                row["chunk_audio_seconds"] = rec.chunk_audio
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
        yield row


def level_folder(level: dict[str, Any]) -> str:
    """``c4`` for concurrency 4, ``rate2.5`` for 2.5 requests/s."""
    rate = level["request_rate"]
    return f"c{level['concurrency']}" if rate is None else f"rate{rate:g}"


def audio_paths(run: PerfRun) -> dict[int, Path]:
    """Where each record with audio is saved, by record index: ``audio/<level>/<label>.wav`` (relative)."""
    levels = {level["level"]: level for level in run.summary["levels"]}
    paths: dict[int, Path] = {}
    taken: set[Path] = set()
    for index, rec in enumerate(run.records):
        if rec.audio is None:
            continue
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", rec.label or "")[:100].strip("._") or f"row{rec.row:05d}"
        path = Path(AUDIO_DIR) / level_folder(levels[rec.level]) / f"{name}.wav"
        if path in taken:
            path = path.with_name(f"{name}-row{rec.row:05d}.wav")
        taken.add(path)
        paths[index] = path
    return paths


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


def _level_axis(axis: Any, xs: list[float], open_loop: bool) -> None:
    """Ticks at the levels; concurrency on a log2 scale (levels usually double)."""
    if not open_loop and len(xs) > 1:
        axis.set_xscale("log", base=2)
    axis.set_xticks(xs, [f"{x:g}" for x in xs])
    axis.grid(alpha=0.3)


def write_plots(summary: dict[str, Any], output_dir: Path) -> list[Path]:
    """Latency (p50 and p99) and throughput against the level's concurrency or request rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = summary["levels"]
    open_loop = any(level["request_rate"] is not None for level in levels)
    xs = [level["request_rate"] if open_loop else level["concurrency"] for level in levels]
    x_label = "request rate (req/s)" if open_loop else "concurrency"
    metrics = ("first_chunk_ms", "e2e_ms") if summary["family"] == "tts" else ("ttft_ms", "itl_ms", "e2e_ms")

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for metric in metrics:
        for stat, style in (("p50", "-o"), ("p99", "--o")):
            ys = [_stat(level, metric, stat) for level in levels]
            if any(y is not None for y in ys):
                axis.plot(xs, [float("nan") if y is None else y for y in ys], style, label=f"{_NAMES[metric]} {stat}")
    axis.set(xlabel=x_label, ylabel="latency (ms)", title=f"{summary['model']}: latency")
    _level_axis(axis, xs, open_loop)
    axis.legend()
    latency = output_dir / LATENCY_PNG
    figure.tight_layout()
    figure.savefig(latency, dpi=100)
    plt.close(figure)

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    left.plot(xs, [level["request_throughput"] or 0 for level in levels], "-o", label="requests/s")
    if summary["slo"]:
        left.plot(xs, [level["goodput"] or 0 for level in levels], "--o", label="goodput")
    left.set(xlabel=x_label, ylabel="requests/s", title="request throughput")
    left.legend()
    if summary["family"] == "tts":
        right.plot(xs, [level["rtf_aggregate"] or 0 for level in levels], "-o")
        right.set(xlabel=x_label, ylabel="RTF (lower is better)", title="aggregate RTF")
    else:
        right.plot(xs, [level["output_token_throughput"] or 0 for level in levels], "-o", label="output")
        right.plot(xs, [level["input_token_throughput"] or 0 for level in levels], "--o", label="input")
        right.set(xlabel=x_label, ylabel="tokens/s", title="token throughput")
        right.legend()
    for axis in (left, right):
        _level_axis(axis, xs, open_loop)
    throughput = output_dir / THROUGHPUT_PNG
    figure.tight_layout()
    figure.savefig(throughput, dpi=100)
    plt.close(figure)
    return [latency, throughput]


def warn_on_stderr(message: str) -> None:
    """The default way a report warning reaches the user: one line on stderr."""
    sys.stderr.write(f"Warning: {message}\n")
    sys.stderr.flush()


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def write_reports(
    run: PerfRun, output_dir: Path, *, plots: bool = True, warn: Callable[[str], None] = warn_on_stderr
) -> list[Path]:
    """Write summary.json, summary.csv, requests.jsonl, the audio (``audio/<level>/<label>.wav``) and (with
    ``plots``) the PNG plots into ``output_dir``.

    The plots come last, and a failure there (matplotlib missing, a plotting error) costs only the plots: it is
    passed to ``warn`` as one line, and the other reports stay.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    summary_json = output_dir / SUMMARY_JSON
    summary_json.write_text(json.dumps(run.summary, indent=2, default=str) + "\n", encoding="utf-8")
    summary_csv = output_dir / SUMMARY_CSV
    write_csv(summary_csv, (_flatten(level) for level in run.summary["levels"]))
    audio = audio_paths(run)
    for index, path in audio.items():
        rec = run.records[index]
        write_wav(output_dir / path, rec.audio, rec.sample_rate)
    requests = output_dir / REQUESTS_JSONL
    with open(requests, "w", encoding="utf-8") as fh:
        for index, row in enumerate(request_rows(run)):
            if index in audio:
                row["audio_file"] = audio[index].as_posix()
            fh.write(json.dumps(row, default=str) + "\n")
    written = [summary_json, summary_csv, requests, *(output_dir / path for path in audio.values())]
    if plots and run.summary["levels"]:
        try:
            written += write_plots(run.summary, output_dir)
        except ImportError as exc:
            warn(
                f"plots skipped: matplotlib cannot be imported ({_one_line(exc)}); "
                "install it with `pip install 'trtdeploy[perf]'`, or pass --no-plots"
            )
        except Exception as exc:
            warn(f"plots skipped: {_one_line(exc)} (the other reports are written)")
    return written
