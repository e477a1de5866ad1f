"""``trtdeploy report``: perf runs side by side. The LLM runs are real perf runs against the fake models on the
bundled tritonserver; the TTS runs are hand-made records through the perf report writer."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from trtdeploy.benchmark import PerfSettings, benchmark
from trtdeploy.cli.main import main
from trtdeploy.errors import ExitCode, Interrupted
from trtdeploy.perf.metrics import LevelStats, request_metrics
from trtdeploy.perf.report import ReportWriter
from trtdeploy.perf.runner import InputSpec, LoadSettings
from trtdeploy.perf.slo import Slo
from trtdeploy.perf.workload import RequestOptions

from ..manifests import write_manifest
from .helpers import level, record

PNG = b"\x89PNG\r\n\x1a\n"


class _CtrlCBeforeLevel:
    """A progress display whose user presses Ctrl-C as the given level (counted from 0) is about to start."""

    def __init__(self, level: int) -> None:
        self.level, self.started = level, 0

    def start_level(self, label: str, total: int | None) -> None:
        if self.started == self.level:
            raise KeyboardInterrupt
        self.started += 1

    def update(self, done: int, errors: int) -> None: ...
    def finish_level(self) -> None: ...


@pytest.fixture(scope="module")
def llm_runs(fake_server, tiny_tokenizer, tmp_path_factory) -> dict[str, Path]:
    """Four perf runs of the fake token model, loaded as qwen_llm deployments of different builds: two closed-loop
    runs with an SLO that differ in max batch size only, an open-loop run, and one interrupted after its first
    level."""
    root = tmp_path_factory.mktemp("llm-runs")

    def perf(name: str, load: LoadSettings, *, slo: str | None = None, progress=None, **point) -> Path:
        deployment = write_manifest(
            root / "deployments" / name,
            models=[],
            entry_model="ensemble",
            model="qwen_llm",
            mode="streaming",
            llm_dir=tiny_tokenizer,
            **point,
        )
        settings = PerfSettings(
            deployment=deployment,
            url=fake_server.grpc_url,
            metrics_url=fake_server.metrics_url,
            model="tensorrt_llm",
            inputs=InputSpec(isl=8, osl=3),
            options=RequestOptions(ignore_eos=True),
            load=load,
            slo=Slo.parse(slo) if slo else None,
            output_dir=root / "runs" / name,
            plots=False,
        )
        benchmark(settings, progress=progress)
        return root / "runs" / name

    closed = LoadSettings(concurrency=(2, 1), num_requests=4, warmup=0)
    runs = {
        "bs8": perf("bs8", closed, slo="ttft_ms<=5000", precision="bf16", gpu="H100", max_batch_size=8),
        "bs16": perf("bs16", closed, slo="ttft_ms<=5000", precision="bf16", gpu="H100", max_batch_size=16),
        "rate": perf("rate", LoadSettings(request_rates=(40,), num_requests=4), precision="fp16", gpu="L4"),
    }
    with pytest.raises(Interrupted):
        perf("cut", closed, progress=_CtrlCBeforeLevel(1), precision="fp8", gpu="H100")
    runs["cut"] = root / "runs" / "cut"
    return runs


def tts_run(out: Path, *, cut: bool = False) -> Path:
    """A streaming TTS run of two levels written by the perf report writer; ``cut``: Ctrl-C in its second level."""
    writer = ReportWriter(out, plots=False)
    writer.started({"model": "spark_tts", "family": "tts", "stream": True, "protocol": "grpc", "slo": None})
    for index, concurrency in enumerate((1, 2)):
        lv = level(concurrency=concurrency, num_requests=2, index=index)
        stats = LevelStats(lv, stream=True, family="tts", slo=None)
        for seq, (send, first, end) in enumerate([(0, 100, 400), (10, 150 * (index + 1), 600)]):
            rec = record(send, end, [(first, 0), (end, 0)], seq=seq, audio=[0.5, 0.5], characters=20, level=index)
            metrics = request_metrics(rec, stream=True, family="tts")
            stats.add(rec, metrics)
            writer.record(rec, lv, metrics)
        status = "interrupted" if cut and index == 1 else "complete"
        writer.level_done(stats.summary(status=status))
    writer.finish("interrupted" if cut else "complete")
    return out


def report(capsys, *args: str) -> tuple[int, str, str]:
    """``trtdeploy report ARGS`` in this process: exit code, stdout, stderr (lines joined)."""
    with pytest.raises(SystemExit) as exited:
        main(["report", *args])
    captured = capsys.readouterr()
    return exited.value.code, captured.out, " ".join(captured.err.split())


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.server
def test_llm_runs_side_by_side(llm_runs, tmp_path, capsys):
    runs = [llm_runs["bs8"], llm_runs["bs16"], llm_runs["rate"]]
    out = tmp_path / "report"
    code, stdout, stderr = report(capsys, *map(str, runs), "--output-dir", str(out))
    assert code == 0, stderr
    labels = ["qwen_llm torch bf16 H100 bs8", "qwen_llm torch bf16 H100 bs16", "qwen_llm torch fp16 L4"]
    printed = " ".join(stdout.split())
    assert all(label in printed for label in labels) and f"report: {out}" in printed
    assert "TTFT p90" in printed and "SLO: ttft_ms<=5000 for 95% of requests (runs without an SLO: -)" in printed

    with open(out / "report.csv") as fh:
        rows = list(csv.DictReader(fh))
    expected = [(run, lv) for run in runs for lv in sorted(summary_of(run)["levels"], key=_load)]
    assert len(rows) == len(expected) == 5  # 2 + 2 levels by concurrency, 1 rate
    for row, (run, lv) in zip(rows, expected, strict=True):
        assert row["run"] == labels[runs.index(run)] and row["path"] == str(run)
        assert row["run_status"] == row["level_status"] == "complete"
        assert (row["concurrency"], row["request_rate"]) == (_cell(lv["concurrency"]), _cell(lv["request_rate"]))
        assert float(row["request_throughput"]) == pytest.approx(lv["request_throughput"])
        assert float(row["output_token_throughput"]) == pytest.approx(lv["output_token_throughput"])
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            for stat in ("p50", "p90"):
                assert float(row[f"{metric}_{stat}"]) == pytest.approx(lv[metric][stat])
        assert (row["attainment"], row["slo_met"]) == (_cell(lv["attainment"]), _cell(lv["slo_met"]))
    assert [row["concurrency"] for row in rows[:2]] == ["1", "2"]  # run as 2, 1: shown by concurrency

    markdown = (out / "report.md").read_text().splitlines()
    assert markdown[0].startswith("| run | load | requests | errors | req/s | out tok/s | TTFT p50 | TTFT p90 |")
    assert len([line for line in markdown if line.startswith("| qwen_llm")]) == 5
    assert "| qwen_llm torch fp16 L4 | 40/s |" in "\n".join(markdown)
    for png in ("throughput.png", "latency.png"):
        assert (out / png).read_bytes()[:8] == PNG


@pytest.mark.server
def test_json_is_the_combined_data_on_stdout_only(llm_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output folder: perf-results/report-<time>/
    code, stdout, stderr = report(capsys, str(llm_runs["bs8"]), str(llm_runs["rate"]), "--json", "--no-plots")
    assert code == 0, stderr
    data = json.loads(stdout)  # nothing else on stdout
    (folder,) = (tmp_path / "perf-results").iterdir()
    assert folder.name.startswith("report-") and Path(data["output_dir"]) == Path("perf-results") / folder.name
    assert sorted(Path(path).name for path in data["files"]) == ["report.csv", "report.json", "report.md"]
    assert sorted(path.name for path in folder.iterdir()) == ["report.csv", "report.json", "report.md"]
    assert json.loads((folder / "report.json").read_text()) == {
        key: value for key, value in data.items() if key not in ("output_dir", "files")
    }
    assert data["family"] == "llm"
    first, second = data["runs"]
    assert first["label"] == "qwen_llm torch bf16 H100" and second["label"] == "qwen_llm torch fp16 L4"
    assert first["build"] == summary_of(llm_runs["bs8"])["build"] and first["build"]["max_batch_size"] == 8
    assert first["slo"] == {"limits": {"ttft_ms": 5000}, "attainment": 0.95} and second["slo"] is None
    rate_level = summary_of(llm_runs["rate"])["levels"][0]
    (rate_row,) = [row for row in data["rows"] if row["run"] == second["label"]]
    assert rate_row["request_rate"] == 40 and rate_row["concurrency"] is None
    assert rate_row["ttft_ms_p90"] == rate_level["ttft_ms"]["p90"] and rate_row["attainment"] is None


@pytest.mark.server
def test_labels_override_and_must_match_the_runs(llm_runs, tmp_path, capsys):
    runs = [str(llm_runs["bs8"]), str(llm_runs["bs16"])]
    out = tmp_path / "out"
    labelled = ("--label", "release A", "--label", "release B", "--json", "--output-dir", str(tmp_path / "a"))
    code, stdout, stderr = report(capsys, *runs, *labelled)
    assert code == 0, stderr
    assert [run["label"] for run in json.loads(stdout)["runs"]] == ["release A", "release B"]

    code, stdout, stderr = report(capsys, *runs, "--label", "only one", "--output-dir", str(out))
    assert code == ExitCode.USAGE, stderr
    assert stderr.startswith("Error: 1 --label for 2 runs") and "one --label per run folder" in stderr
    assert stdout == "" and not out.exists()

    code, _, stderr = report(capsys, *runs, "--label", "same", "--label", "same")
    assert code == ExitCode.USAGE and "--label 'same' is given to two runs" in stderr

    code, _, stderr = report(capsys, runs[0], runs[0] + "/")
    assert code == ExitCode.USAGE and f"{llm_runs['bs8']} is given twice" in stderr

    copies = [tmp_path / "monday" / "run", tmp_path / "tuesday" / "run"]  # the same build measured twice
    for copy in copies:
        shutil.copytree(llm_runs["bs8"], copy)
    code, stdout, stderr = report(capsys, *map(str, copies), "--json", "--output-dir", str(tmp_path / "b"))
    assert code == 0, stderr
    assert [run["label"] for run in json.loads(stdout)["runs"]] == [f"qwen_llm torch bf16 H100 ({c})" for c in copies]


@pytest.mark.server
def test_an_interrupted_run_is_included_and_marked(llm_runs, tmp_path, capsys):
    cut = summary_of(llm_runs["cut"])
    assert cut["status"] == "interrupted" and [lv["concurrency"] for lv in cut["levels"]] == [2]
    code, stdout, stderr = report(capsys, str(llm_runs["bs8"]), str(llm_runs["cut"]), "--output-dir", str(tmp_path))
    assert code == 0, stderr
    printed = " ".join(stdout.split())
    assert "qwen_llm torch fp8 H100 (interrupted)" in printed
    assert "runs marked (interrupted) did not finish: the levels they measured" in printed
    rows = json.loads((tmp_path / "report.json").read_text())["rows"]
    assert [(row["run"], row["run_status"], row["concurrency"]) for row in rows] == [
        ("qwen_llm torch bf16 H100", "complete", 1),
        ("qwen_llm torch bf16 H100", "complete", 2),
        ("qwen_llm torch fp8 H100", "interrupted", 2),
    ]
    assert "| qwen_llm torch fp8 H100 (interrupted) | 2 |" in (tmp_path / "report.md").read_text()


def test_tts_runs_show_first_chunk_and_rtf_and_mark_a_cut_level(tmp_path, capsys):
    whole, cut = tts_run(tmp_path / "whole"), tts_run(tmp_path / "cut", cut=True)
    out = tmp_path / "report"
    code, stdout, stderr = report(capsys, str(whole), str(cut), "--output-dir", str(out))
    assert code == 0, stderr
    printed = " ".join(stdout.split())
    assert "1st chunk p95" in printed and "RTF p95" in printed and "audio s/s" in printed
    assert "* level ended early (interrupted)" in printed and "cut (interrupted)" in printed
    data = json.loads((out / "report.json").read_text())
    assert [run["label"] for run in data["runs"]] == ["whole", "cut"]  # no build: the folder names
    rows = {(row["run"], row["concurrency"]): row for row in data["rows"]}
    for run, label in ((whole, "whole"), (cut, "cut")):
        for lv in summary_of(run)["levels"]:
            row = rows[label, lv["concurrency"]]
            assert row["level_status"] == lv["status"]
            assert row["first_chunk_ms_p50"] == lv["first_chunk_ms"]["p50"]
            assert row["first_chunk_ms_p95"] == lv["first_chunk_ms"]["p95"]
            assert row["e2e_ms_p95"] == lv["e2e_ms"]["p95"]
            assert row["rtf_aggregate"] == lv["rtf_aggregate"] and row["rtf_p95"] == lv["rtf"]["p95"]
            assert row["audio_seconds_per_second"] == pytest.approx(lv["audio_seconds"] / lv["duration_s"])
    assert rows["whole", 2]["first_chunk_ms_p95"] > rows["whole", 1]["first_chunk_ms_p95"]
    markdown = (out / "report.md").read_text()
    assert "| cut (interrupted) | 2* |" in markdown and "\n- \\* level ended early (interrupted)\n" in markdown
    for png in ("throughput.png", "latency.png"):
        assert (out / png).read_bytes()[:8] == PNG


@pytest.mark.server
def test_runs_of_different_families_are_refused(llm_runs, tmp_path, capsys):
    speech = tts_run(tmp_path / "speech")
    out = tmp_path / "out"
    code, stdout, stderr = report(capsys, str(llm_runs["bs8"]), str(speech), "--output-dir", str(out))
    assert code == ExitCode.USAGE == 2
    assert stderr.startswith(
        f"Error: the runs measure different workload families (llm: {llm_runs['bs8']}; tts: {speech})"
    )
    assert "report the runs of each family separately" in stderr and stderr.count("Error:") == 1
    assert stdout == "" and not out.exists()


def _older(run: Path) -> None:
    """The summary as perf wrote it before levels and runs had a status."""
    summary = summary_of(run)
    del summary["status"]
    for lv in summary["levels"]:
        del lv["status"]
    (run / "summary.json").write_text(json.dumps(summary))


def _damaged_slo(run: Path) -> None:
    summary = summary_of(run)
    summary["slo"] = {"limit": {}}
    (run / "summary.json").write_text(json.dumps(summary))


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        (lambda run: run.rename(run.with_name("gone")), ExitCode.NOT_FOUND, "run folder {run} does not exist"),
        (_damaged_slo, ExitCode.USAGE, "{run}/summary.json has an unreadable slo"),
        (lambda run: (run / "summary.json").unlink(), ExitCode.NOT_FOUND, "{run} is not a perf run: it has no summary"),
        (lambda run: (run / "summary.json").write_text("{"), ExitCode.USAGE, "{run}/summary.json is unreadable"),
        (_older, ExitCode.USAGE, "{run}/summary.json is not a perf summary this version reads: it has no status"),
    ],
    ids=["missing", "damaged-slo", "no-summary", "unreadable", "older"],
)
def test_a_folder_that_is_not_a_run_is_named(tmp_path, capsys, make, code, message):
    good, run = tts_run(tmp_path / "good"), tts_run(tmp_path / "bad")
    make(run)
    out = tmp_path / "out"
    exit_code, stdout, stderr = report(capsys, str(good), str(run), "--output-dir", str(out))
    assert exit_code == code, stderr
    assert stderr.startswith(f"Error: {message.format(run=run)}") and stderr.count("Error:") == 1
    assert "Hint:" in stderr and stdout == "" and not out.exists()


def test_a_run_folder_is_refused_as_the_output_folder(tmp_path, capsys):
    run = tts_run(tmp_path / "run")
    before = sorted(path.name for path in run.iterdir())
    code, stdout, stderr = report(capsys, str(run), "--output-dir", str(run))
    assert code == ExitCode.USAGE and stdout == ""
    assert f"Error: --output-dir {run} is one of the runs" in stderr
    assert sorted(path.name for path in run.iterdir()) == before


def test_a_report_folder_is_told_apart_from_a_run(tmp_path, capsys):
    run = tts_run(tmp_path / "run")
    first = tmp_path / "first"
    assert report(capsys, str(run), "--output-dir", str(first), "--no-plots")[0] == 0
    code, _, stderr = report(capsys, str(run), str(first))
    assert code == ExitCode.NOT_FOUND
    assert f"Error: {first} is a `trtdeploy report` folder: it has no summary.json" in stderr


def _cell(value: object) -> str:
    """``value`` as report.csv holds it."""
    return "" if value is None else str(value)


def _load(lv: dict) -> float:
    return lv["concurrency"] if lv["request_rate"] is None else lv["request_rate"]
