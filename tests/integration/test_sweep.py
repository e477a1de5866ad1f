"""`trtdeploy sweep` end to end on a tiny random Qwen2: every point built, served by the real tritonserver, measured
by the real perf client and stopped; the report over the points; resumed runs measure only what is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import interruptible, run_cli
from ..server.helpers import leftovers, wait_until

pytestmark = pytest.mark.server

PERF = ("-c", "1,2", "--isl", "8", "--osl", "6", "--ignore-eos", "--num-requests", "8")


@pytest.fixture
def state(tmp_path) -> dict[str, str]:
    """Environment for the CLI runs: this test's own server records."""
    return {"TRTDEPLOY_STATE_DIR": str(tmp_path / "state")}


def sweep_args(checkpoint: Path, out: Path, *args: str) -> list[str]:
    return ["sweep", "qwen_llm", "--model-dir", str(checkpoint), "--gpu", "cpu", "--output-dir", str(out), *args]


def sweep(checkpoint: Path, out: Path, state: dict[str, str], *args: str, returncode: int = 0) -> dict:
    """``trtdeploy sweep ... --json`` run in the test's folder; its result, checked against sweep.json."""
    done = run_cli(*sweep_args(checkpoint, out, *args), "--json", cwd=out.parent, env=state)
    assert done.returncode == returncode, done.stderr
    result = json.loads(done.stdout)
    assert {key: result[key] for key in ("status", "points", "best")} == {
        key: json.loads((out / "sweep.json").read_text())[key] for key in ("status", "points", "best")
    }
    assert leftovers(mentioning=out.parent / "deployments") == [], "a point's server was left running"
    return result


def run_folders(out: Path) -> list[Path]:
    return sorted(path.parent for path in (out / "runs").glob("*/*/summary.json"))


def test_a_2x2_sweep_measures_every_point_reports_the_best_and_measures_nothing_twice(qwen_checkpoint, tmp_path, state):
    out = tmp_path / "sweep"
    matrix = ("--max-batch-size", "2,4", "--isl-osl", "32:8,48:8")
    first = sweep(qwen_checkpoint, out, state, *matrix, *PERF, "--slo", "ttft_ms_p90<=60000")
    points = first["points"]
    assert [point["status"] for point in points] == ["measured"] * 4, [point["reason"] for point in points]
    assert len({point["deployment"] for point in points}) == 4 and len(run_folders(out)) == 4
    for point in points:
        summary = json.loads((out / point["run_dir"] / "summary.json").read_text())
        assert summary["status"] == "complete" and [lv["concurrency"] for lv in summary["levels"]] == [1, 2]
        assert summary["build"]["max_batch_size"] == int(point["label"].split("-bs")[1].split("-")[0])
    # the best point: the most output tokens/s per GPU among the levels that met the SLO (all did), read back here
    per_gpu = {
        (point["label"], level["concurrency"]): level["output_token_throughput"] / point["gpus"]
        for point in points
        for level in json.loads((out / point["run_dir"] / "summary.json").read_text())["levels"]
    }
    label, concurrency = max(per_gpu, key=per_gpu.get)
    best = first["best"]
    assert (best["point"], best["concurrency"], best["under_slo"]) == (label, concurrency, True)
    assert best["throughput_per_gpu"] == pytest.approx(per_gpu[label, concurrency])
    for name in ("pareto.png", "throughput.png", "latency.png", "report.md", "report.csv", "sweep.md"):
        assert (out / name).stat().st_size > 0, name
    assert label in (out / "sweep.md").read_text()
    report = json.loads((out / "report.json").read_text())
    assert len(report["runs"]) == 4 and len(report["rows"]) == 8

    again = sweep(qwen_checkpoint, out, state, *matrix, *PERF, "--slo", "ttft_ms_p90<=60000")
    assert [point["status"] for point in again["points"]] == ["reused"] * 4
    assert [point["run_dir"] for point in again["points"]] == [point["run_dir"] for point in points]
    assert len(run_folders(out)) == 4  # nothing measured the second time
    other = sweep(qwen_checkpoint, out, state, *matrix[:2], *PERF[:-1], "6")  # other perf settings: measured anew
    assert [point["status"] for point in other["points"]] == ["measured"] * 2
    assert other["best"]["under_slo"] is False

    compared = run_cli("report", str(out), "--output-dir", str(tmp_path / "compared"), "--no-plots", "--json")
    assert compared.returncode == 0, compared.stderr
    assert len(json.loads(compared.stdout)["runs"]) == 2  # the sweep folder stands for its latest points' runs


def test_points_that_cannot_be_built_or_measured_are_reported_and_the_others_complete(qwen_checkpoint, tmp_path, state):
    out = tmp_path / "sweep"
    # fp8: the torch engine cannot build it; 32:4: perf's --osl 6 is more than that point's max_output_len; fp32
    # given twice is one point
    result = sweep(qwen_checkpoint, out, state, "--precision", "fp32,fp8,fp32", "--isl-osl", "32:8,32:4", *PERF)
    by_status = {}
    for point in result["points"]:
        by_status.setdefault(point["status"], []).append(point)
    reasons = [(point["label"], point["status"], point["reason"]) for point in result["points"]]
    assert len(by_status.get("measured", ())) == 1 and len(by_status["invalid"]) == 2, reasons
    (failed,) = by_status["perf_failed"]
    assert (
        "isl32-osl4" in failed["label"]
        and "--osl 6 is more than this deployment's max_output_len 4" in failed["reason"]
    )
    assert all("cannot build precision 'fp8'" in point["reason"] for point in by_status["invalid"])
    assert result["best"]["point"] == by_status["measured"][0]["label"]
    assert "perf failed" in (out / "sweep.md").read_text()


def test_an_interrupted_sweep_keeps_its_finished_points_and_resumes(qwen_checkpoint, tmp_path, state):
    out = tmp_path / "sweep"
    # a level of ~10 s: long enough to be cut mid-level
    matrix_and_perf = ("--max-batch-size", "2,4", "-c", "1", "--isl", "8", "--osl", "24", "--ignore-eos")
    matrix_and_perf += ("--num-requests", "200", "--no-plots")
    second_run = out / "runs" / "torch-fp32-bs4-tp1pp1-streaming"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtdeploy", *sweep_args(qwen_checkpoint, out, *matrix_and_perf)],
        cwd=tmp_path, env={**os.environ, **state}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=interruptible,
    )  # fmt: skip
    try:  # the first point measured, the second one's level under way
        assert wait_until(lambda: any(second_run.glob("*/requests.jsonl")), timeout=180), proc.stderr
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Interrupted: 1 of 2 points measured" in " ".join(stderr.split()) and "Traceback" not in stderr
    record = json.loads((out / "sweep.json").read_text())
    assert record["status"] == "interrupted"
    assert [point["status"] for point in record["points"]] == ["measured", "interrupted"]
    assert leftovers(mentioning=tmp_path / "deployments") == []
    first, cut = (point["run_dir"] for point in record["points"])
    assert json.loads((out / first / "summary.json").read_text())["status"] == "complete"
    assert json.loads((out / cut / "summary.json").read_text())["status"] == "interrupted"

    resumed = sweep(qwen_checkpoint, out, state, *matrix_and_perf)
    assert [point["status"] for point in resumed["points"]] == ["reused", "measured"]
    assert [point["run_dir"] for point in resumed["points"]] == [first, f"{cut}-2"]  # the cut run is kept beside


def test_a_sweep_that_measures_nothing_exits_with_the_first_points_failure(qwen_checkpoint, tmp_path, state):
    out = tmp_path / "sweep"
    done = run_cli(*sweep_args(qwen_checkpoint, out, "--precision", "fp8,int4_awq", *PERF), cwd=tmp_path, env=state)
    assert done.returncode == 2, done.stderr
    assert "no point of the sweep could be measured" in done.stderr and "cannot build precision 'fp8'" in done.stderr
    record = json.loads((out / "sweep.json").read_text())
    assert [point["status"] for point in record["points"]] == ["invalid", "invalid"]
    assert [point["exit_code"] for point in record["points"]] == [2, 2]


def test_perf_options_the_model_cannot_take_stop_the_sweep_before_any_server(qwen_checkpoint, tmp_path, state):
    out = tmp_path / "sweep"
    args = sweep_args(qwen_checkpoint, out, "--max-batch-size", "2,4", *PERF, "--slo", "rtf<=1")
    done = run_cli(*args, cwd=tmp_path, env=state)
    assert done.returncode == 2, done.stderr
    assert "rtf" in done.stderr and "llm" in done.stderr
    record = json.loads((out / "sweep.json").read_text())
    assert record["status"] == "failed"
    assert [point["status"] for point in record["points"]] == ["perf_failed", "pending"]
    assert record["points"][0]["run_dir"] is None and not (out / "runs").exists()


def test_failed_requests_beyond_max_error_rate_exit_6_measured_or_reused(qwen_checkpoint, tmp_path, state):
    out = tmp_path / "sweep"
    args = ("--max-batch-size", "2", "-c", "1", "--isl", "8", "--osl", "6", "--num-requests", "4", "--timeout", "0.001")
    for expected in ("measured", "reused"):
        done = run_cli(*sweep_args(qwen_checkpoint, out, *args), cwd=tmp_path, env=state)
        assert done.returncode == 6, done.stderr
        assert "1 of 1 points had more failed requests than --max-error-rate allows" in " ".join(done.stderr.split())
        (point,) = json.loads((out / "sweep.json").read_text())["points"]
        assert (point["status"], point["error_rate_exceeded"]) == (expected, True)
        assert "requests failed" in point["reason"]
