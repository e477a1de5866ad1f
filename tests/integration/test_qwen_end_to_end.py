"""The main job through the real command line: build → serve --background → perf → stop, on a tiny random Qwen2.

Real tritonserver (bundled), real torch engine, real perf client; the assertions read the per-request records.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ..conftest import run_cli
from ..server.helpers import leftovers, port_free

pytestmark = pytest.mark.server

OSL = 12


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> dict[str, str]:
    """Environment for CLI runs: this module's own server records."""
    return {"TRTDEPLOY_STATE_DIR": str(tmp_path_factory.mktemp("state"))}


@pytest.fixture(scope="module", params=["streaming", "offline"])
def served(request, qwen_checkpoint, tmp_path_factory, state):
    """A deployment built and served in the background through the CLI; stopped (and checked) afterwards."""
    root = tmp_path_factory.mktemp(f"e2e-{request.param}")
    built = run_cli(
        "build", "qwen_llm", "--model-dir", str(qwen_checkpoint), "--gpu", "cpu", "--mode", request.param,
        "--max-batch-size", "4", "--max-input-len", "64", "--max-output-len", "32", "--json", cwd=root,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    deployment = json.loads(built.stdout)["deployment"]
    started = run_cli("serve", "--background", "--json", cwd=root, env=state)  # the latest build under root
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    assert info["deployment"] == deployment
    yield request.param, root, info
    stopped = run_cli("stop", "--port", str(info["grpc_port"]), "--json", env=state)
    assert stopped.returncode == 0, stopped.stderr
    assert leftovers(pgid=info["pgid"]) == []
    assert all(port_free(info[key]) for key in ("http_port", "grpc_port", "metrics_port"))


def perf_records(root: Path, state: dict[str, str], *args: str) -> tuple[dict, list[dict]]:
    out = root / "perf"
    result = run_cli("perf", *args, "--output-dir", str(out), "--json", cwd=root, env=state)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    for name in ("summary.csv", "requests.jsonl"):
        assert (out / name).stat().st_size > 0
    assert list(out.glob("*.png")), "no plots written"
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return summary, records


def max_overlap(records: list[dict]) -> int:
    """The most requests in flight at one instant, from their start times and latencies."""
    events = sorted([(r["start_ms"], 1) for r in records] + [(r["start_ms"] + r["e2e_ms"], -1) for r in records])
    depth = best = 0
    for _, step in events:
        depth += step
        best = max(best, depth)
    return best


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_measures_every_request(served, state, protocol):
    mode, root, _ = served
    args = ["--concurrency", "1,4", "--num-requests", "8", "--isl", "16", "--osl", str(OSL), "--ignore-eos"]
    summary, records = perf_records(root, state, *args, "--protocol", protocol)
    measured = [r for r in records if not r["warmup"]]
    assert [level["requests"] for level in summary["levels"]] == [8, 8]
    assert len(measured) == 16  # N requests in, N records out
    assert all(r["error"] is None for r in records)
    assert all(r["output_tokens"] == OSL for r in measured)  # end tokens disabled: exact lengths
    assert all(r["token_source"] == "server" for r in measured)
    assert all(r["input_tokens"] == 16 for r in measured)
    assert all(r["e2e_ms"] > 0 for r in measured)
    if mode == "streaming":
        assert all(0 < r["ttft_ms"] < r["e2e_ms"] for r in measured)
        assert all(sum(r["chunk_tokens"]) == OSL and len(r["chunk_tokens"]) > 1 for r in measured)  # tokens as made
        assert all(r["itl_ms"] > 0 for r in measured)
    else:  # one response per request: no first token to time apart from the whole
        assert all(r["ttft_ms"] is None and len(r["chunk_tokens"]) == 1 for r in measured)
    at_four = [r for r in measured if r["concurrency"] == 4]
    assert max_overlap(at_four) >= 3  # requests overlap in time: served together, not one after another
    level = summary["levels"][1]
    assert level["output_token_throughput"] > 0 and level["errors"] == 0 and level["server"]["models"]


def test_accuracy_against_reference_outputs(served, state, tmp_path):
    mode, root, _ = served
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"input": f"question {i}", "output": "an answer"}) for i in range(4)))
    summary, records = perf_records(root, state, "--input-data", str(prompts), "--osl", "4")
    accuracy = summary["levels"][0]["accuracy"]
    assert set(accuracy) >= {"exact_match", "rouge_l_f1"}
    assert all(r["reference"] == "an answer" and 0 <= r["rouge_l_f1"] <= 1 for r in records if not r["warmup"])
    assert accuracy["requests"] == 4


def test_bad_inputs_are_clear_errors_and_the_server_keeps_serving(served, state, tmp_path):
    _, root, info = served
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "fine"}\n{"input": unquoted}\n')
    result = run_cli("perf", "--input-data", str(bad), cwd=root, env=state)
    assert result.returncode == 2 and f"{bad}:2" in result.stderr
    table = tmp_path / "table.jsonl"
    table.write_text('{"question": "q"}\n')
    result = run_cli("perf", "--dataset", str(table), "--column", "prompt", cwd=root, env=state)
    assert result.returncode == 3 and "prompt" in result.stderr and "question" in result.stderr
    for levels in ("0", "1,x"):
        result = run_cli("perf", "--concurrency", levels, cwd=root, env=state)
        assert result.returncode == 2 and "--concurrency" in result.stderr
    result = run_cli("perf", "--url", "localhost:1", "--no-plots", cwd=root, env=state)
    assert result.returncode == 5 and "localhost:1" in result.stderr
    assert result.stderr.count("Error:") == 1
    ok = run_cli("perf", "--num-requests", "2", "--isl", "8", "--osl", "2", "--no-plots", cwd=root, env=state)
    assert ok.returncode == 0, ok.stderr  # and nothing above disturbed the server
    assert leftovers(pgid=info["pgid"]), "the server should still run"


def test_a_model_that_fails_to_load_leaves_no_process(qwen_checkpoint, tmp_path, state):
    """The checkpoint disappears after the build: tensorrt_llm fails to load; serve names it, exits 5, cleans up."""
    import shutil

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(qwen_checkpoint, checkpoint)
    built = run_cli("build", "qwen_llm", "--model-dir", str(checkpoint), "--gpu", "cpu", "--json", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (checkpoint / "model.safetensors").unlink()
    result = run_cli("serve", "--background", cwd=tmp_path, env=state)
    assert result.returncode == 5
    assert "'tensorrt_llm' failed to load" in result.stderr
    # the log's error line, with where the model raised it: not the tables tritonserver writes after it
    assert "--- error lines of" in result.stderr
    assert re.search(
        r"\nfailed to load 'tensorrt_llm' version 1: Internal: \w+: .*model\.safetensors.* \(at ", result.stderr
    )
    assert leftovers(mentioning=Path(json.loads(built.stdout)["deployment"])) == []


def test_unknown_model_and_a_failed_build_are_refused(tmp_path, state):
    result = run_cli("build", "no_such_model", cwd=tmp_path)
    assert result.returncode == 3 and "unknown model 'no_such_model'" in result.stderr
    failed = tmp_path / "deployments" / "qwen_llm" / "torch-fp32-bs8-tp1pp1-streaming.failed"
    failed.mkdir(parents=True)
    (failed / "manifest.json").write_text(json.dumps({"status": "failed", "error": "convert step failed"}))
    result = run_cli("serve", str(failed), env=state)
    assert result.returncode == 4 and "not a complete build" in result.stderr and "convert step failed" in result.stderr
    result = run_cli("perf", str(failed), "--url", "localhost:1", env=state)
    assert result.returncode in (4, 5)


def test_a_deployment_of_an_uninstalled_plugin_is_named(served, state, tmp_path):
    _, root, info = served
    ghost = tmp_path / "ghost"
    ghost.mkdir()
    manifest = json.loads((Path(info["deployment"]) / "manifest.json").read_text())
    manifest["point"]["model"] = "ghost_model"
    (ghost / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli("perf", str(ghost), "--url", f"localhost:{info['grpc_port']}", env=state)
    assert result.returncode == 3
    assert "unknown model 'ghost_model'" in result.stderr and "qwen_llm" in result.stderr


def test_the_server_as_a_remote_host_sees_it(served, qwen_checkpoint, tmp_path):
    """Without the server's record (a remote host's server, reached over HTTP alone): the text ensemble and the LLM
    contract are told from their configurations, counted with --tokenizer, and stream when they are decoupled."""
    mode, root, info = served
    remote = {"TRTDEPLOY_STATE_DIR": str(tmp_path / "no-records")}
    url = ["--url", f"localhost:{info['http_port']}", "--protocol", "http", "--tokenizer", str(qwen_checkpoint)]
    lengths = ["--isl", "16", "--osl", str(OSL), "--ignore-eos", "--num-requests", "2", "--no-plots", "--json"]
    for model, workload in (("ensemble", "qwen_llm"), ("tensorrt_llm", "tensorrt_llm")):
        out = tmp_path / model
        result = run_cli("perf", *url, "--model", model, *lengths, "--output-dir", str(out), cwd=root, env=remote)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["remote"]["workload"] == workload and summary["build"] is None
        assert summary["stream"] is (mode == "streaming")
        level = summary["levels"][0]
        assert level["errors"] == 0 and level["input_tokens"]["min"] == level["input_tokens"]["max"] == 16
        assert level["output_tokens"]["min"] == level["output_tokens"]["max"] == OSL
        records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        assert all(sum(r["chunk_tokens"]) == OSL for r in records)
        assert all((len(r["chunk_tokens"]) > 1) is (mode == "streaming") for r in records)  # tokens as made
