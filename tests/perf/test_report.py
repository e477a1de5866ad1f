"""Reports written from a run, the console table, and the error-rate exit."""

from __future__ import annotations

import csv
import json
import sys

import pytest
from rich.console import Console

from trtdeploy.errors import ExitCode, PerfError
from trtdeploy.perf import report
from trtdeploy.perf.loadgen import Level
from trtdeploy.perf.metrics import request_metrics
from trtdeploy.perf.report import ReportWriter, print_table
from trtdeploy.perf.runner import PerfRun

from .helpers import level, record, summarize_level

HEADER = {
    "model": "ensemble",
    "family": "llm",
    "stream": True,
    "protocol": "grpc",
    "slo": {"limits": {"ttft_ms": 12}, "attainment": 0.95},
}


def _levels(errors: int = 0) -> list[tuple[Level, list, dict]]:
    """Two levels of hand-made records: (level, its records, its summary)."""
    out = []
    for index, concurrency in enumerate((1, 2)):
        recs = [
            record(0, 40, [(10, 1), (40, 3)], seq=0, warmup=True, level=index),
            record(0, 50, [(10, 1), (50, 3)], seq=1, level=index, text="a b", reference="a b"),
            record(5, 45, [(15, 1), (45, 3)], seq=2, level=index),
        ]
        recs += [record(5, 6, seq=3 + i, level=index, error="INTERNAL: boom") for i in range(errors)]
        lv = level(concurrency=concurrency, num_requests=2 + errors, warmup=1, index=index)
        summary = summarize_level(recs, lv, stream=True, family="llm", slo="ttft_ms<=12", client_cpu_s=[0.01])
        summary["server"] = {"models": {"ensemble": {"requests": 3, "avg_request_ms": 30.0}}, "metrics": None}
        out.append((lv, recs, summary))
    return out


def _run(errors: int = 0) -> PerfRun:
    return PerfRun(summary={**HEADER, "levels": [summary for _, _, summary in _levels(errors)]})


def _metrics(rec):
    return None if rec.error else request_metrics(rec, stream=HEADER["stream"], family=HEADER["family"])


def write_reports(out, errors: int = 0, **kwargs) -> list:
    """Replay hand-made levels through a ReportWriter, as the engine would; the files it wrote."""
    writer = ReportWriter(out, **kwargs)
    writer.started(HEADER)
    for lv, recs, summary in _levels(errors):
        for rec in recs:
            writer.record(rec, lv, _metrics(rec))
        writer.level_done(summary)
    return writer.finish()


def test_reports_are_written(tmp_path):
    written = write_reports(tmp_path / "out", errors=1)
    names = sorted(path.name for path in written)
    assert names == ["latency.png", "requests.jsonl", "summary.csv", "summary.json", "throughput.png"]
    for png in ("latency.png", "throughput.png"):
        assert (tmp_path / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [lv["concurrency"] for lv in summary["levels"]] == [1, 2]
    assert summary["status"] == "complete" and "definitions" in summary

    with open(tmp_path / "out" / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2
    assert rows[0]["concurrency"] == "1" and float(rows[0]["ttft_ms_p50"]) == pytest.approx(10.0)
    assert rows[1]["server_ensemble_avg_request_ms"] == "30.0"

    lines = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 8  # 2 levels x (1 warmup + 2 measured + 1 failed)
    failed = [line for line in lines if line["error"]]
    assert len(failed) == 2 and failed[0]["error"] == "INTERNAL: boom" and failed[0]["e2e_ms"] == pytest.approx(1)
    ok = next(line for line in lines if line["seq"] == 1 and line["level"] == 0)
    assert ok["ttft_ms"] == pytest.approx(10) and ok["chunk_ms"] == pytest.approx([10, 50])
    assert ok["exact_match"] is True and ok["reference"] == "a b"
    assert sum(line["warmup"] for line in lines) == 2


def test_each_level_is_on_disk_as_soon_as_it_ends(tmp_path):
    """A run that dies after its first level leaves that level's summary and records complete."""
    writer = ReportWriter(tmp_path, plots=False)
    writer.started(HEADER)
    (lv, recs, summary), _ = _levels()
    for rec in recs:
        writer.record(rec, lv, _metrics(rec))
    writer.level_done(summary)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["status"] == "running" and [level["level"] for level in on_disk["levels"]] == [0]
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == len(recs)
    writer.finish("server_lost")
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "server_lost"


def test_no_plots_when_asked(tmp_path):
    names = sorted(path.name for path in write_reports(tmp_path, plots=False))
    assert names == ["requests.jsonl", "summary.csv", "summary.json"]


def test_error_rate_over_the_limit_is_a_perf_error(tmp_path):
    run = _run(errors=1)
    run.output_dir = tmp_path
    run.check_error_rate(0.5)  # 1 of 3 failed: within 50 %
    with pytest.raises(PerfError) as caught:
        run.check_error_rate(0.0)
    assert caught.value.exit_code == ExitCode.PERF_ERRORS == 6
    assert caught.value.message == "1 of 3 requests failed at concurrency 1 (error rate 33.3% > --max-error-rate 0)"
    assert "INTERNAL: boom" in caught.value.hint and "requests.jsonl" in caught.value.hint
    _run().check_error_rate(0.0)


def test_table_at_natural_width_off_a_terminal():
    console = Console(width=60, record=True, force_terminal=False)
    print_table(console, _run(errors=1).summary)
    text = console.export_text()
    assert "TTFT p50/p99" in text and "E2E p50/p99" in text and "…" not in text
    assert "10.0/10.0" in text  # TTFT p50/p99 of the first level
    assert "goodput: req/s meeting ttft_ms<=12; SLO: their share, ✓ for ttft_ms<=12 for 95% of requests" in text
    assert "66.7% ✗" in text  # 2 of 3 requests within 12 ms: the failed one meets no limit


def test_missing_matplotlib_skips_only_the_plots(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    warnings: list[str] = []
    written = write_reports(tmp_path / "out", warn=warnings.append)
    assert sorted(path.name for path in written) == ["requests.jsonl", "summary.csv", "summary.json"]
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == sorted(path.name for path in written)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("plots skipped: matplotlib cannot be imported") and "--no-plots" in warnings[0]


def test_a_plotting_error_skips_only_the_plots(tmp_path, monkeypatch, capsys):
    def broken(summary, output_dir):
        raise ValueError("bad axis\nsecond line")

    monkeypatch.setattr(report, "write_plots", broken)
    written = write_reports(tmp_path)  # the default warning goes to stderr
    assert sorted(path.name for path in written) == ["requests.jsonl", "summary.csv", "summary.json"]
    assert capsys.readouterr().err == "Warning: plots skipped: ValueError: bad axis (the other reports are written)\n"
