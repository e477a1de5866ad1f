"""``trtdeploy serve`` and ``trtdeploy stop`` as a user runs them: subprocesses of the real entry point."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request
from pathlib import Path

import pytest

from trtdeploy.errors import ExitCode

from .helpers import leftovers, port_free, run_cli, start_cli, wait_until, write_deployment

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
    state_file = state_dir / "servers" / f"{ports[1]}.json"
    try:
        assert wait_until(state_file.exists, timeout=60), proc.stderr.read() if proc.poll() is not None else ""
        info = json.loads(state_file.read_text())
        assert info["background"] is False and info["entry_model"] == "echo"
        assert _ready(ports[0])
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert f"localhost:{ports[1]}" in stdout and "echo" in stdout and "tritonserver.log" in stdout
    assert "tritonserver stopped" in stderr
    assert leftovers(pgid=info["pgid"], mentioning=dep) == []
    assert not state_file.exists()
    assert all(port_free(p) for p in ports)
    assert (dep / "logs" / "tritonserver.log").is_file()


def test_foreground_serve_fails_when_the_server_dies(tmp_path: Path, ports: list[int], state_dir: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "echo")
    proc = start_cli("serve", str(dep), *_port_args(ports))
    state_file = state_dir / "servers" / f"{ports[1]}.json"
    try:
        assert wait_until(state_file.exists, timeout=60)
        info = json.loads(state_file.read_text())
        os.kill(info["pid"], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.SERVER
    assert "exited on its own" in stderr and "last lines of" in stderr
    assert leftovers(pgid=info["pgid"], mentioning=dep) == []


def test_background_serve_then_stop(tmp_path: Path, ports: list[int], state_dir: Path) -> None:
    dep = write_deployment(tmp_path / "dep", "echo")
    started = run_cli("serve", str(dep), "--background", "--json", *_port_args(ports))
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    assert info["grpc_url"] == f"localhost:{ports[1]}" and info["http_url"] == f"localhost:{ports[0]}"
    assert info["metrics_url"] == f"http://localhost:{ports[2]}/metrics"
    assert info["entry_model"] == "echo" and info["deployment"] == str(dep.resolve())
    assert info["background"] is True and (state_dir / "servers" / f"{ports[1]}.json").is_file()
    assert _ready(ports[0])
    stopped = run_cli("stop", "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert [s["pid"] for s in json.loads(stopped.stdout)["stopped"]] == [info["pid"]]
    assert leftovers(pgid=info["pgid"], mentioning=dep) == []
    assert all(port_free(p) for p in ports)
    assert not (state_dir / "servers" / f"{ports[1]}.json").exists()
    again = run_cli("stop")
    assert again.returncode == ExitCode.SERVER and "no running server" in again.stderr


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
    assert "last lines of" in result.stderr and "UNAVAILABLE" in result.stderr
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
