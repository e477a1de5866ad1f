"""perf under faults, as a user meets them: the server killed or frozen mid-level, Ctrl-C, a broken stream, a long
run. Every measured record stays on disk, nothing hangs, and nothing is left running after ``trtdeploy stop``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from trtdeploy.errors import ExitCode
from trtdeploy.perf.llm import TextLLMWorkload
from trtdeploy.perf.runner import Endpoint, LoadSettings, run_levels
from trtdeploy.perf.workload import InputRow, RequestOptions

from ..conftest import interruptible
from ..server.helpers import leftovers, wait_until

pytestmark = pytest.mark.server
CLI = [sys.executable, "-m", "trtdeploy"]
MS = 1_000_000


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of the CLI runs: a state folder of this test's own."""
    return {**os.environ, "TRTDEPLOY_STATE_DIR": str(tmp_path / "state")}


def cli(*args: str, env: dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def start_perf(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "perf", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
        preexec_fn=interruptible,
    )  # fmt: skip


@pytest.fixture
def served(make_deployment, tmp_path: Path, env: dict[str, str]):
    """A deployment of the fake token LLM (2 ms per token, streaming) served in the background by the CLI; its
    server record. `trtdeploy stop` runs at the end whatever happened."""
    deployment = make_deployment(models=["tensorrt_llm"])
    started = cli("serve", str(deployment), "--background", "--json", env=env, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    record = json.loads(Path(info["state_file"]).read_text())
    yield deployment, record
    cli("stop", "--all", env=env, cwd=tmp_path)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def check_nothing_lost(out: Path) -> dict:
    """summary.json and requests.jsonl agree: every request each level counted is a line, once."""
    summary = json.loads((out / "summary.json").read_text())
    rows = lines(out / "requests.jsonl")
    per_level = Counter(row["level"] for row in rows)
    for level in summary["levels"]:
        assert per_level[level["level"]] == level["requests"] + level["warmup_requests"], level
    assert len({(row["level"], row["seq"]) for row in rows}) == len(rows)
    return summary


def shm_regions(prefix: str) -> list[str]:
    return sorted(path.name for path in Path("/dev/shm").glob(f"{prefix}*"))


PERF_ARGS = ("--model", "tensorrt_llm", "--isl", "8", "--osl", "30", "--ignore-eos", "--no-plots")


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=lambda s: s.name)
def test_a_server_lost_mid_level_ends_perf_within_seconds_and_keeps_its_records(served, tmp_path, env, fault):
    deployment, record = served
    out = tmp_path / "out"
    perf = start_perf(
        str(deployment),
        *PERF_ARGS,
        "-c",
        "4",
        "--num-requests",
        "2000",
        "--output-dir",
        str(out),
        env=env,
        cwd=tmp_path,
    )
    try:
        assert wait_until(lambda: len(lines(out / "requests.jsonl")) >= 20, timeout=60), perf.stderr
        os.kill(record["pid"], fault)
        faulted = time.monotonic()
        _, stderr = perf.communicate(timeout=60)
        took = time.monotonic() - faulted
    finally:
        if perf.poll() is None:
            perf.kill()
    assert perf.returncode == ExitCode.SERVER, stderr
    assert took < 20, f"perf took {took:.1f} s to notice"  # no request waits out its 600 s timeout
    assert "Traceback" not in stderr and stderr.count("Error:") == 1
    assert "stopped answering" in stderr and f"results so far in {out}" in " ".join(stderr.split())
    summary = check_nothing_lost(out)
    assert summary["status"] == "server_lost" and summary["levels"][-1]["status"] == "server_lost"
    level = summary["levels"][-1]
    assert 20 <= level["requests"] < level["planned_requests"] == 2000
    assert level["completed"] >= 16 and level["errors"] >= 1

    stopped = cli("stop", env=env, cwd=tmp_path)  # the bare stop: the deployment under this folder
    assert stopped.returncode == 0, stopped.stderr
    assert wait_until(lambda: leftovers(pgid=record["pgid"], mentioning=deployment) == [], timeout=30)
    assert shm_regions(record["shm_prefix"]) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_keeps_the_finished_level_and_what_the_cut_one_measured(served, tmp_path, env, workers):
    deployment, _ = served
    out = tmp_path / "out"
    args = (*PERF_ARGS, "-c", "8,1", "--num-requests", "40", "--workers", str(workers), "--output-dir", str(out))
    perf = start_perf(str(deployment), *args, env=env, cwd=tmp_path)
    try:
        assert wait_until((out / "summary.json").exists, timeout=90), perf.stderr  # level 1 (c=8) is done
        time.sleep(0.5)  # level 2 (c=1, 40 x 60 ms) is under way
        perf.send_signal(signal.SIGINT)
        stdout, stderr = perf.communicate(timeout=60)
    finally:
        if perf.poll() is None:
            perf.kill()
    assert perf.returncode == ExitCode.INTERRUPTED == 130, stderr
    assert "Traceback" not in stderr and stdout == ""
    message = " ".join(stderr.split())
    assert "Interrupted: 1 level complete; concurrency 1 cut short after" in message
    assert f"results so far in {out}" in message
    summary = check_nothing_lost(out)
    assert summary["status"] == "interrupted"
    assert [level["status"] for level in summary["levels"]] == ["complete", "interrupted"]
    first, cut = summary["levels"]
    assert first["requests"] == first["completed"] == 40
    assert cut["requests"] < 40


def test_rows_are_fresh_for_warmup_and_every_level(fake_server, make_deployment, tmp_path, env):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"prompt number {i}"}) + "\n" for i in range(100)))
    url = ("--url", fake_server.grpc_url, "--input-data", str(prompts), "--osl", "2", "--no-plots")
    deployment = str(make_deployment())
    done = cli(
        "perf", deployment, "--model", "tensorrt_llm", *url, "-c", "1,2", "--output-dir", "a", env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    rows = lines(tmp_path / "a" / "requests.jsonl")
    groups = {}
    for row in rows:
        groups.setdefault((row["level"], row["warmup"]), []).append(row["row"])
    assert sorted(groups) == [(0, False), (0, True), (1, False), (1, True)]
    flat = [row for group in groups.values() for row in group]
    assert len(flat) == len(set(flat))  # no row twice: warmups and levels disjoint
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["input_reuse"] == "fresh" and [lv["input_rows_reused"] for lv in summary["levels"]] == [0, 0]
    assert "reuse a row" not in done.stderr

    few = cli(
        "perf",
        deployment,
        "--model",
        "tensorrt_llm",
        *url,
        "-c",
        "1,2",
        "--num-requests",
        "60",
        "--output-dir",
        "b",
        env=env,
        cwd=tmp_path,
    )
    assert few.returncode == 0, few.stderr
    assert "the input has 100 rows for the 123 requests of this run: 23 measured requests reuse a row" in " ".join(
        few.stderr.split()
    )
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert [lv["input_rows_reused"] for lv in summary["levels"]] == [0, 23]


def test_client_memory_stays_flat_over_5000_requests(fake_server, make_deployment, tmp_path, env):
    """Peak RSS of the perf process over 5,000 streamed requests (30 responses each) against 500: records go to
    disk as they complete, so the difference is allocator noise (keeping the raw responses cost ~360 MB here)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": f"prompt {i}"}) + "\n" for i in range(64)))
    deployment = str(make_deployment())
    peaks = {}
    for count in (500, 5000):
        peak = tmp_path / f"peak-{count}"
        code = (
            "import atexit, resource, sys\n"
            f"atexit.register(lambda: open({str(peak)!r}, 'w').write(str(resource.getrusage(resource.RUSAGE_SELF)"
            ".ru_maxrss)))\n"
            "from trtdeploy.cli.main import main\n"
            "main(sys.argv[1:])\n"
        )
        args = ["perf", deployment, "--url", fake_server.grpc_url, "--model", "tensorrt_llm", "--input-data"]
        args += [str(prompts), "--reuse-rows", "--osl", "30", "--ignore-eos", "-c", "16", "--warmup", "0"]
        args += ["--num-requests", str(count), "--no-plots", "--output-dir", f"run-{count}"]
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
        )
        assert done.returncode == 0, done.stderr
        assert len(lines(tmp_path / f"run-{count}" / "requests.jsonl")) == count
        peaks[count] = int(peak.read_text()) / 1024  # MiB
    assert peaks[5000] - peaks[500] < 25, peaks


class CuttingProxy:
    """A TCP proxy from a local port to ``target_port``; :meth:`cut` closes every connection open now."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            connections, self.connections = self.connections, []
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_a_broken_stream_fails_only_the_requests_it_carried(fake_server):
    """The connection is cut mid-level: the requests in flight on it fail, the slots reopen their streams, and no
    request sent on a new stream is failed by the end of the old one."""
    proxy = CuttingProxy(fake_server.grpc_port)
    rows = [InputRow(f"count the words of prompt {i}") for i in range(60)]
    load = LoadSettings(concurrency=(2,), num_requests=60, warmup=0)

    async def scenario():
        endpoint = Endpoint(f"127.0.0.1:{proxy.port}", "grpc")
        options = RequestOptions(max_tokens=10)  # 50 ms a request: 1.5 s for the level
        task = asyncio.ensure_future(
            run_levels(TextLLMWorkload("text_llm_stream"), rows, endpoint, load, options=options)
        )
        await asyncio.sleep(0.6)
        cut_ns = time.perf_counter_ns()
        proxy.cut()
        return await task, cut_ns

    try:
        result, cut_ns = asyncio.run(scenario())
    finally:
        proxy.close()
    records = result.records
    assert len(records) == 60
    failed = [rec for rec in records if rec.error is not None]
    # the requests in flight on the two streams, and any a slot sent before the client saw the cut
    assert 1 <= len(failed) <= 4, [rec.error for rec in failed]
    assert all(rec.error.startswith(("UNAVAILABLE", "stream closed")) for rec in failed), [r.error for r in failed]
    seen = min(rec.end_ns for rec in failed)  # when the client saw the connection break
    assert all(cut_ns - 1000 * MS < rec.send_ns < seen for rec in failed)  # none sent on a stream opened after it
    after = [rec for rec in records if rec.send_ns > max(rec.end_ns for rec in failed)]
    assert after and all(rec.error is None for rec in after)
    assert result.summary["levels"][0]["status"] == "complete"
