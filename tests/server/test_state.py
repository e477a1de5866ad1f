"""State files: how ``perf`` and ``stop`` in another shell find the servers ``serve`` started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trtdeploy.errors import ServerError
from trtdeploy.server import ServerInfo, current_server, running_servers, stop_servers
from trtdeploy.server._process import process_start_ticks


def _write_state(state_dir: Path, info: ServerInfo, mtime: float | None = None) -> Path:
    path = state_dir / "servers" / f"{info.grpc_port}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info.to_dict()))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _live(grpc_port: int, pid: int | None = None) -> ServerInfo:
    pid = pid or os.getpid()
    return ServerInfo(
        http_port=grpc_port + 1,
        grpc_port=grpc_port,
        metrics_port=grpc_port + 2,
        pid=pid,
        pgid=pid,
        start_ticks=process_start_ticks(pid),
        entry_model="echo",
    )


def test_no_server_is_a_clear_error() -> None:
    with pytest.raises(ServerError, match="no running server found") as caught:
        current_server()
    assert "trtdeploy serve --background" in caught.value.hint and "--url" in caught.value.hint


def test_latest_live_server_wins_and_stale_files_go(state_dir: Path) -> None:
    older = _write_state(state_dir, _live(9001), mtime=1_000_000)
    _write_state(state_dir, _live(9101), mtime=2_000_000)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = _write_state(state_dir, _live(9201, pid=dead.pid))
    reused = _write_state(state_dir, ServerInfo(grpc_port=9301, pid=os.getpid(), start_ticks=1))  # pid reused
    broken = state_dir / "servers" / "9401.json"
    broken.write_text("{not json")
    assert current_server().grpc_url == "localhost:9101"
    assert [s.grpc_port for s in running_servers()] == [9101, 9001]
    assert older.exists() and not stale.exists() and not reused.exists() and not broken.exists()


def test_url_finds_the_local_server_or_stands_for_itself(state_dir: Path) -> None:
    _write_state(state_dir, _live(9001))
    assert current_server("localhost:9001").entry_model == "echo"
    assert current_server("http://127.0.0.1:9002").entry_model == "echo"  # its HTTP port
    remote = current_server("gpu-host:8001")
    assert (remote.grpc_url, remote.http_url, remote.pid) == ("gpu-host:8001", None, None)
    assert current_server("http://gpu-host:8000").http_url == "gpu-host:8000"
    with pytest.raises(ServerError, match="bad server URL"):
        current_server("gpu-host")


def test_stop_with_nothing_running() -> None:
    with pytest.raises(ServerError, match="no running server found"):
        stop_servers()
    with pytest.raises(ServerError, match="no running server on port 8001"):
        stop_servers(port=8001)


def test_stop_by_port_only_stops_that_server(state_dir: Path) -> None:
    sleepers = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    try:
        for port, proc in zip((9001, 9101), sleepers, strict=True):
            _write_state(state_dir, _live(port, pid=proc.pid))
        stopped = stop_servers(port=9102)  # the second one's HTTP port
        assert [s.pid for s in stopped] == [sleepers[1].pid]
        assert sleepers[1].wait(timeout=10) == -15 and sleepers[0].poll() is None
        assert [s.grpc_port for s in running_servers()] == [9001]
        assert [s.pid for s in stop_servers(all=True)] == [sleepers[0].pid]
        assert sleepers[0].wait(timeout=10) == -15
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()


def test_an_unwritable_state_folder_is_refused_before_the_server_starts(tmp_path, monkeypatch):
    from trtdeploy.server._state import writable_servers_dir

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(blocker))
    with pytest.raises(ServerError, match="cannot write server records") as info:
        writable_servers_dir()
    assert "TRTDEPLOY_STATE_DIR" in info.value.hint
