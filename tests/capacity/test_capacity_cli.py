"""``trtdeploy capacity`` on perf run folders written by perf's report writer, and a sweep's folder of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtdeploy.capacity import recommend_hpa
from trtdeploy.cli.main import main
from trtdeploy.errors import ExitCode

from .runs import write_llm_run

#: A replica measured at 1, 2 and 4 in flight: 100, 120 and 200 ms (10, 16.7 and 20 req/s).
LATENCIES = {1: [100.0] * 40, 2: [120.0] * 40, 4: [200.0] * 40}
BUILD = {"model": "qwen_llm", "engine": "trtllm", "gpu": "H100", "tp": 2, "pp": 1, "replicas": 1, "gpus_needed": 2}


def capacity(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["capacity", *args])
    captured = capsys.readouterr()
    return exited.value.code, captured.out, " ".join(captured.err.split())


@pytest.fixture
def run(tmp_path) -> Path:
    return write_llm_run(tmp_path / "run", LATENCIES, build=BUILD, slo="e2e_ms_p99<=1000")


def test_a_run_planned_for_a_target_rate(run, tmp_path, capsys):
    code, stdout, _ = capacity(
        capsys,
        *("--perf", str(run), "--target-rate", "100", "--duration", "600", "--gpus-per-node", "1", "--json"),
        *("--output-dir", str(tmp_path / "plan")),
    )
    assert code == 0
    data = json.loads(stdout)
    (planned,) = data["plans"]
    # the run's own SLO; the best level is 4 in flight at 20 req/s, 16 with 20% kept spare: 7 replicas
    assert (planned["slots"], planned["replica_throughput"]) == (4, pytest.approx(20.0))
    assert planned["replicas_for_throughput"] == 7
    assert planned["replicas"] == 7
    assert (planned["gpus_per_replica"], planned["pods_per_replica"]) == (2, 2)
    assert (planned["gpus"], planned["pods"]) == (14, 14)
    assert [s["balancing"] for s in planned["simulated"]] == ["round-robin", "least-requests"]
    for simulated in planned["simulated"]:
        assert simulated["slo_met"]
        assert simulated["percentiles"]["e2e_ms"]["p50"] >= 100
        assert simulated["percentiles"]["ttft_ms"]["p50"] >= 10
        # below the target at the planned load: the HPA adds no replica
        assert simulated["hpa_headroom"] == pytest.approx(1 - simulated["in_flight"] / planned["hpa"]["in_flight"])
        assert simulated["hpa_headroom"] > 0
    assert sorted(path.name for path in (tmp_path / "plan").iterdir()) == ["capacity.csv", "capacity.json"]
    target = recommend_hpa(run)
    assert target.to_dict() == planned["hpa"]
    # 16 req/s (20% spare) took 1.9 in flight in the closed loop (0.9 of the way from the level of 1 in flight at
    # 10 req/s to that of 2 at 16.7); Poisson arrivals at that rate hold more
    assert (target.slots, target.rate) == (4, pytest.approx(16.0))
    assert 1.9 < target.in_flight < 4


def test_the_table_names_the_replicas_gpus_and_balancers(run, capsys):
    code, stdout, _ = capacity(capsys, "--perf", str(run), "--target-rate", "30", "--duration", "300")
    assert code == 0
    assert "capacity for 30 req/s under e2e_ms_p99<=1000 (20% headroom)" in stdout
    assert "round-robin" in stdout and "least-requests" in stdout
    assert "HPA target" in stdout
    assert "pods: 1 per replica of 2 GPUs" in " ".join(stdout.split())  # 8 GPUs a node by default


def test_a_stricter_slo_runs_each_replica_at_a_lower_level(run, capsys):
    code, stdout, _ = capacity(
        capsys, "--perf", str(run), "--target-rate", "30", "--slo", "e2e_ms_p99<=150", "--duration", "300", "--json"
    )
    assert code == 0
    (planned,) = json.loads(stdout)["plans"]
    assert (planned["slots"], planned["level"]) == (2, "2")
    assert planned["slo"] == "e2e_ms_p99<=150"


def test_a_sweep_is_planned_per_point_and_the_fewest_gpus_chosen(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    write_llm_run(sweep / "runs" / "tp2", LATENCIES, build={**BUILD, "point": "tp2"})
    faster = {c: [took / 3 for took in values] for c, values in LATENCIES.items()}  # 3x the throughput on 4 GPUs
    write_llm_run(sweep / "runs" / "tp4", faster, build={**BUILD, "tp": 4, "gpus_needed": 4, "point": "tp4"})
    points = [{"label": name, "status": "measured", "run_dir": f"runs/{name}"} for name in ("tp2", "tp4")]
    (sweep / "sweep.json").write_text(json.dumps({"points": points}))
    code, stdout, _ = capacity(
        capsys,
        "--sweep",
        str(sweep),
        "--target-rate",
        "100",
        "--slo",
        "e2e_ms_p99<=1000",
        "--duration",
        "300",
        "--json",
    )
    assert code == 0
    data = json.loads(stdout)
    gpus = {each["label"]: each["gpus"] for each in data["plans"]}
    assert gpus == {"qwen_llm trtllm H100 tp2pp1": 14, "qwen_llm trtllm H100 tp4pp1": 12}
    assert data["best"] == "qwen_llm trtllm H100 tp4pp1"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--target-rate", "10"], ExitCode.USAGE, "Error: pass one of --perf RUN_DIR and --sweep SWEEP_DIR"),
        (["--perf", "{missing}", "--target-rate", "10"], ExitCode.NOT_FOUND, "Error: run folder {missing} does not"),
        (["--perf", "{run}", "--target-rate", "0"], ExitCode.USAGE, "Error: --target-rate must be > 0 requests/s"),
        (["--perf", "{run}", "--target-rate", "5", "--headroom", "1"], ExitCode.USAGE, "Error: --headroom must be"),
        (
            ["--perf", "{run}", "--target-rate", "inf"],
            ExitCode.USAGE,
            "Error: --target-rate must be > 0 requests/s, got inf",
        ),
        (
            ["--perf", "{run}", "--target-rate", "nan"],
            ExitCode.USAGE,
            "Error: --target-rate must be > 0 requests/s, got nan",
        ),
        (
            ["--perf", "{run}", "--target-rate", "5", "--duration", "inf"],
            ExitCode.USAGE,
            "Error: --duration must be > 0",
        ),
        (["--perf", "{run}", "--target-rate", "5", "--duration", "0"], ExitCode.USAGE, "Error: --duration must be > 0"),
        (
            ["--perf", "{run}", "--target-rate", "1e6"],
            ExitCode.USAGE,
            "Error: 1e+06 req/s for 3600 s is 3,600,000,000 requests to simulate, more than the 10,000,000 one "
            "simulation holds Hint: a shorter --duration (at most 10 s at this rate) or a lower --target-rate",
        ),
        (
            ["--perf", "{run}", "--target-rate", "5", "--slo", "e2e_ms_p99<=50"],
            ExitCode.USAGE,
            "Error: qwen_llm trtllm H100: the SLO (e2e_ms_p99<=50) cannot be met by one replica at any measured load "
            "(levels 1, 2, 4) "
            "Hint: measure lower loads",
        ),
        (
            ["--perf", "{run}", "--target-rate", "5", "--slo", "rtf<=1"],
            ExitCode.USAGE,
            "Error: --slo rtf cannot be measured for streamed llm requests",
        ),
        (["--perf", "{run}", "--target-rate", "5", "--attainment", "0.9"], ExitCode.USAGE, "pass --slo too"),
    ],
)
def test_bad_input_is_one_line_with_a_hint(run, tmp_path, capsys, args, code, message):
    names = {"run": run, "missing": tmp_path / "missing"}
    exit_code, stdout, stderr = capacity(capsys, *(arg.format(**names) for arg in args))
    assert (exit_code, stdout) == (code, "")
    assert message.format(**names) in stderr
    assert "Traceback" not in stderr
    assert "Hint:" in stderr


def test_a_run_without_slo_or_build_needs_them_named(tmp_path, capsys):
    bare = write_llm_run(tmp_path / "bare", LATENCIES)
    code, _, stderr = capacity(capsys, "--perf", str(bare), "--target-rate", "5")
    assert code == ExitCode.USAGE
    assert f"Error: {bare} was measured without an SLO, and none is given Hint: pass --slo" in stderr
    code, _, stderr = capacity(capsys, "--perf", str(bare), "--target-rate", "5", "--slo", "e2e_ms<=500")
    assert code == ExitCode.USAGE
    assert "Error: bare does not record the build it measured" in stderr and "--gpus-per-replica" in stderr
    args = ("--perf", str(bare), "--target-rate", "5", "--slo", "e2e_ms<=500", "--gpus-per-replica", "1")
    assert capacity(capsys, *args, "--duration", "60")[0] == 0
