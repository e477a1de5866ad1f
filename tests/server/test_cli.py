"""``trtdeploy serve`` and ``trtdeploy stop`` as a user runs them: subprocesses of the real entry point."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from trtdeploy.deployment import Deployment
from trtdeploy.errors import ExitCode
from trtdeploy.server import serve_deployment
from trtdeploy.server._process import process_alive

from .helpers import (
    leftovers,
    listen_addresses,
    port_free,
    record_of,
    run_cli,
    shm_regions,
    start_cli,
    stubs_of,
    wait_until,
    write_deployment,
)

pytestmark = pytest.mark.server


def _ready(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _port_args(ports: list[int]) -> list[str]:
    return ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_foreground_serve_stops_cleanly_on_a_signal(
    tmp_path: Path, ports: list[int], state_dir: Path, sig: signal.Signals
) -> None:
    dep = write_deployment(tmp_path / "dep", "echo")
    proc = start_cli("serve", str(dep), *_port_args(ports))
    try:
        assert wait_until(lambda: record_of(state_dir, ports[1]), timeout=60), (
            proc.stderr.read() if proc.poll() is not None else ""
        )
        state_file = record_of(state_dir, ports[1])
        info = json.loads(state_file.read_text())
        assert info["background"] is False and info["entry_model"] == "echo"
        assert _ready(ports[0])
        banner = []  # the whole banner is out before the signal (the server is recorded before it is printed)
        for line in proc.stdout:
            banner.append(line)
            if line.split()[:1] == ["log"]:
                break
        proc.send_signal(sig)
        rest, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout = "".join(banner) + rest
    assert proc.returncode == 0, stderr
    assert f"127.0.0.1:{ports[1]}" in stdout and "echo" in stdout and info["log_file"] in stdout
    assert "tritonserver stopped" in stderr
    assert leftovers(pgid=info["pgid"], mentioning=dep) == []
    assert not state_file.exists()
    assert all(port_free(p) for p in ports)
    assert (dep / "logs" / "tritonserver.log").resolve() == Path(info["log_file"])


def test_foreground_serve_fails_when_the_server_dies(tmp_path: Path, ports: list[int], state_dir: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "echo")
    proc = start_cli("serve", str(dep), *_port_args(ports))
    try:
        assert wait_until(lambda: record_of(state_dir, ports[1]), timeout=60)
        info = json.loads(record_of(state_dir, ports[1]).read_text())
        os.kill(info["pid"], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.SERVER
    assert "exited on its own" in stderr and "last lines of" in stderr
    assert leftovers(pgid=info["pgid"], mentioning=dep) == []


def test_background_serve_then_stop_twice(tmp_path: Path, ports: list[int], state_dir: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "echo")
    started = run_cli("serve", str(dep), "--background", "--json", *_port_args(ports))
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    assert info["grpc_url"] == f"127.0.0.1:{ports[1]}" and info["http_url"] == f"127.0.0.1:{ports[0]}"
    assert info["metrics_url"] == f"http://127.0.0.1:{ports[2]}/metrics"
    assert info["entry_model"] == "echo" and info["deployment"] == str(dep.resolve())
    assert info["background"] is True and Path(info["state_file"]).is_file()
    assert info["triton_version"] == "2.51.0" and info["bundled"] is True and info["bind_address"] == "127.0.0.1"
    assert "tritonserver 2.51.0: " in started.stderr
    assert "bundled Triton 2.51: for development and benchmarks; production runs the NGC image's current Triton" in (
        started.stderr
    )
    secret = json.loads(Path(info["state_file"]).read_text())["restricted_key"][1]
    assert "restricted_key" not in info and secret not in started.stdout + started.stderr
    assert _ready(ports[0]) and all(listen_addresses(port) == {"127.0.0.1"} for port in ports)
    stopped = run_cli("stop", "--json", cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert [s["pid"] for s in json.loads(stopped.stdout)["stopped"]] == [info["pid"]]
    assert secret not in stopped.stdout
    assert leftovers(pgid=info["pgid"], mentioning=dep) == []
    assert all(port_free(p) for p in ports)
    assert not Path(info["state_file"]).exists()
    again = run_cli("stop", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip() == f"nothing to stop: no trtdeploy server runs for a deployment under {tmp_path}"
    assert json.loads(run_cli("stop", "--json", cwd=tmp_path).stdout) == {"stopped": []}


def test_latest_deployment_under_the_current_folder_is_served(tmp_path: Path, ports: list[int]) -> None:
    dep = write_deployment(tmp_path / "deployments" / "echo_model" / "torch-fp32", "echo")
    log = tmp_path / "elsewhere" / "server.log"
    started = run_cli(
        "serve", "-d", "--json", "--log-file", str(log), "--log-verbose", "1", *_port_args(ports), cwd=tmp_path
    )
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    stopped = run_cli("stop", "--port", str(ports[0]))
    assert stopped.returncode == 0, stopped.stderr
    assert info["deployment"] == str(dep.resolve()) and info["log_file"] == str(log)
    assert "--log-verbose=1" in log.read_text() and not (dep / "logs").exists()
    assert leftovers(pgid=info["pgid"], mentioning=dep) == []


def test_port_in_use(tmp_path: Path, ports: list[int]) -> None:
    dep = write_deployment(tmp_path / "dep", "echo")
    with socket.socket() as busy:
        busy.bind(("", ports[1]))
        busy.listen()
        result = run_cli("serve", str(dep), *_port_args(ports))
    assert result.returncode == ExitCode.SERVER
    assert f"port {ports[1]} (gRPC) is in use" in result.stderr and "trtdeploy stop" in result.stderr
    assert leftovers(mentioning=dep) == []


def test_model_that_fails_to_load(tmp_path: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "echo", "broken")
    result = run_cli("serve", str(dep))
    assert result.returncode == ExitCode.SERVER
    assert "model 'broken' failed to load: Internal: RuntimeError: weights are missing" in result.stderr
    assert "--- error lines of" in result.stderr
    assert "failed to load 'broken' version 1: Internal: RuntimeError: weights are missing (at " in result.stderr
    assert "UNAVAILABLE" not in result.stderr  # the model table at the log's end is not what is shown
    assert leftovers(mentioning=dep) == []


def test_ctrl_c_during_startup_leaves_nothing(tmp_path: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "slow")
    log = dep / "logs" / "tritonserver.log"
    proc = start_cli("serve", str(dep))
    try:
        assert wait_until(lambda: log.is_file() and "loading: slow" in log.read_text(), timeout=60)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.INTERRUPTED, stderr
    assert leftovers(mentioning=dep) == []


def test_tritonserver_that_does_not_exist(tmp_path: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "echo")
    result = run_cli("serve", str(dep), "--tritonserver", "/nonexistent")
    assert result.returncode == ExitCode.SERVER
    assert "Error: tritonserver not found at /nonexistent" in result.stderr
    assert "--tritonserver" in result.stderr


def test_failed_build_is_refused(tmp_path: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "echo", status="failed")
    result = run_cli("serve", str(dep))
    assert result.returncode == ExitCode.BUILD_FAILED
    assert "not a complete build" in result.stderr


def test_a_multi_gpu_deployment_without_mpirun_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "echo", tp=2)
    result = run_cli("serve", str(dep), env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == ExitCode.SERVER, result.stderr
    assert "world size 2 needs mpirun" in result.stderr
    assert leftovers(mentioning=dep) == []


def _serve_background(dep: Path, *args: str) -> dict:
    """``serve --background --json``'s record, plus its stderr."""
    started = run_cli("serve", str(dep), "--background", "--json", *args)
    assert started.returncode == 0, started.stderr
    return {**json.loads(started.stdout), "stderr": started.stderr}


@pytest.mark.parametrize("command", ["stop", "serve"])
def test_what_a_killed_server_left_is_cleaned_up(tmp_path: Path, state_dir: Path, command: str) -> None:
    """tritonserver SIGKILLed while its parent does not reap it: its python-backend stubs (which ignore SIGTERM)
    live on with their shared memory until `stop`, or the sweep at the next `serve`, cleans up after it."""
    dep = write_deployment(tmp_path / "dep", "echo")
    server, info = serve_deployment(Deployment.load(dep), background=True)
    try:
        stubs, regions = stubs_of(server.pid), shm_regions(server.shm_prefix)
        assert len(stubs) == 1 and len(regions) == 1
        os.kill(server.pid, signal.SIGKILL)  # a zombie until reaped, which its stubs take for a live parent
        assert wait_until(lambda: not process_alive(server.pid), timeout=10)
        if command == "stop":
            result = run_cli("stop", cwd=tmp_path)
            assert "nothing to stop" in result.stderr
        else:  # the same deployment: the dead server's record does not block it
            result = run_cli("serve", str(dep), "--background", "--json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert (
            f"Warning: the server on gRPC port {info.grpc_port} ({dep.resolve()}) had died; its record is removed: "
            "killed 1 leftover process, removed 1 shared-memory region"
        ) in " ".join(result.stderr.split())
        assert not any(process_alive(pid) for pid in stubs)
        assert shm_regions(server.shm_prefix) == [] and not info.state_file.exists()
    finally:
        server.process.wait()
        server.stop()
    if command == "serve":
        assert [s["deployment"] for s in json.loads(run_cli("stop", str(dep), "--json").stdout)["stopped"]] == [
            str(dep.resolve())
        ]


def test_a_bare_stop_acts_on_the_deployment_here_and_never_guesses(tmp_path: Path) -> None:
    a = write_deployment(tmp_path / "x" / "a", "echo")
    b = write_deployment(tmp_path / "y" / "b", "echo")
    served = [_serve_background(dep) for dep in (a, b)]
    try:
        refused = run_cli("stop", cwd=tmp_path)
        assert refused.returncode == ExitCode.USAGE, refused.stderr
        assert f"Error: 2 servers run for deployments under {tmp_path}: " in refused.stderr
        for info in served:
            assert f"{info['grpc_url']} (pid {info['pid']}, {info['deployment']})" in refused.stderr
        assert "--port P" in refused.stderr and "trtdeploy stop DEPLOYMENT" in refused.stderr
        assert "--all" in refused.stderr
        again = run_cli("serve", str(a), "--background")
        assert again.returncode == ExitCode.SERVER
        assert (
            f"Error: {a.resolve()} is served already: gRPC {served[0]['grpc_url']}, HTTP {served[0]['http_url']}, "
            f"pid {served[0]['pid']}, log {served[0]['log_file']}"
        ) in again.stderr
        assert f"trtdeploy stop {a.resolve()}" in again.stderr
        only_a = run_cli("stop", "--json", cwd=tmp_path / "x")
        assert only_a.returncode == 0, only_a.stderr
        assert [s["pid"] for s in json.loads(only_a.stdout)["stopped"]] == [served[0]["pid"]]
        assert _ready(served[1]["http_port"]) and not _ready(served[0]["http_port"])
        logs = sorted(p.name for p in (a / "logs").iterdir())
        assert logs == [Path(served[0]["log_file"]).name, "tritonserver.log"]
        assert (a / "logs" / "tritonserver.log").resolve() == Path(served[0]["log_file"])
    finally:
        run_cli("stop", "--all")
    assert leftovers(mentioning=tmp_path) == []


def test_an_explicit_log_of_a_running_server_is_refused(tmp_path: Path) -> None:
    a = write_deployment(tmp_path / "a", "echo")
    b = write_deployment(tmp_path / "b", "echo")
    log = tmp_path / "shared.log"
    served = _serve_background(a, "--log-file", str(log))
    try:
        refused = run_cli("serve", str(b), "--log-file", str(log))
        assert refused.returncode == ExitCode.SERVER
        assert f"Error: {log} is the log of the running server {served['grpc_url']} (pid {served['pid']}" in (
            refused.stderr
        )
    finally:
        run_cli("stop", "--all")


def test_triton_default_ports_then_the_next_free_triple(tmp_path: Path) -> None:
    if not all(port_free(p) for p in (8000, 8001, 8002)):
        pytest.skip("Triton's default ports 8000-8002 are in use by something else")
    a = write_deployment(tmp_path / "a", "echo")
    b = write_deployment(tmp_path / "b", "echo")
    try:
        first = _serve_background(a)
        assert (first["http_port"], first["grpc_port"], first["metrics_port"]) == (8000, 8001, 8002)
        assert "default ports" not in first["stderr"]
        second = _serve_background(b)
        http = second["http_port"]
        assert http > 8002 and (http - 8000) % 3 == 0
        assert (second["grpc_port"], second["metrics_port"]) == (http + 1, http + 2)
        assert (
            "Triton's default ports 8000-8002 are taken by the trtdeploy server "
            f"127.0.0.1:8001 (pid {first['pid']}, {first['deployment']}): this server uses HTTP {http}, "
            f"gRPC {http + 1}, metrics {http + 2}"
        ) in second["stderr"]
    finally:
        run_cli("stop", "--all")


def test_host_and_allow_api_open_the_server(tmp_path: Path, ports: list[int]) -> None:
    dep = write_deployment(tmp_path / "dep", "echo")
    bad = run_cli("serve", str(dep), "--allow-api", "shared-memory,everything")
    assert bad.returncode == ExitCode.USAGE and "--allow-api: unknown API 'everything'" in bad.stderr
    info = _serve_background(dep, "--host", "0.0.0.0", "--allow-api", "all", *_port_args(ports))
    try:
        for port in ports:
            assert listen_addresses(port) and listen_addresses(port) <= {"0.0.0.0", "::"}
        assert info["bind_address"] == "0.0.0.0" and info["grpc_url"] == f"127.0.0.1:{ports[1]}"
        assert info["restricted_apis"] == []
        assert json.loads(Path(info["state_file"]).read_text())["restricted_key"] is None
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/logging", timeout=10) as response:
            assert response.status == 200  # restricted by default
    finally:
        run_cli("stop", "--port", str(ports[1]))
