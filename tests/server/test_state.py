"""Server records: how ``perf`` and ``stop`` in another shell find the servers ``serve`` started, and how the
records of dead servers are swept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from trtdeploy.errors import ServerError, UsageError
from trtdeploy.server import (
    ServerCleanupWarning,
    ServerInfo,
    choose_server,
    current_server,
    running_servers,
    servers_of,
    servers_to_stop,
    servers_under,
    stop_server,
)
from trtdeploy.server._process import process_alive, process_start_ticks
from trtdeploy.server._state import writable_servers_dir

from .helpers import shm_regions, wait_until


def _write_state(state_dir: Path, info: ServerInfo, mtime: float | None = None) -> Path:
    path = state_dir / "servers" / f"{info.grpc_port}-{info.pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info.to_dict(secrets=True)))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _live(grpc_port: int, pid: int | None = None, deployment: Path | None = None) -> ServerInfo:
    pid = pid or os.getpid()
    return ServerInfo(
        http_port=grpc_port + 1,
        grpc_port=grpc_port,
        metrics_port=grpc_port + 2,
        pid=pid,
        pgid=pid,
        start_ticks=process_start_ticks(pid),
        entry_model="echo",
        deployment=deployment,
    )


def test_no_server_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=f"no server runs for a deployment under {tmp_path}") as caught:
        choose_server(tmp_path)
    assert "trtdeploy serve --background" in caught.value.hint and "--url" in caught.value.hint
    assert "running elsewhere" not in caught.value.hint


def test_live_servers_newest_first_and_stale_records_go(state_dir: Path) -> None:
    older = _write_state(state_dir, _live(9001), mtime=1_000_000)
    _write_state(state_dir, _live(9101), mtime=2_000_000)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = _write_state(state_dir, _live(9201, pid=dead.pid))
    reused = _write_state(state_dir, ServerInfo(grpc_port=9301, pid=os.getpid(), start_ticks=1))  # pid reused
    broken = state_dir / "servers" / "9401-1.json"
    broken.write_text("{not json")
    with pytest.warns(ServerCleanupWarning) as caught:
        assert [s.grpc_port for s in running_servers()] == [9101, 9001]
    assert older.exists() and not stale.exists() and not reused.exists() and not broken.exists()
    assert sorted(str(w.message).split(" (")[0] for w in caught) == [
        "the server on gRPC port 9201",
        "the server on gRPC port 9301",
    ]


def test_servers_are_found_by_deployment_and_folder(tmp_path: Path, state_dir: Path) -> None:
    a, b, other = tmp_path / "here" / "a", tmp_path / "here" / "b", tmp_path / "there" / "c"
    for path in (a, b, other):
        path.mkdir(parents=True)
    _write_state(state_dir, _live(9001, deployment=a))
    _write_state(state_dir, _live(9101, deployment=other))
    assert [s.grpc_port for s in servers_of(a)] == [9001] and servers_of(b) == []
    assert [s.grpc_port for s in servers_of(tmp_path / "here" / ".." / "here" / "a")] == [9001]
    assert [s.grpc_port for s in servers_under(tmp_path / "here")] == [9001]
    assert [s.grpc_port for s in servers_under(a)] == [9001]  # a deployment folder is under itself
    assert choose_server(tmp_path / "here").grpc_port == 9001
    with pytest.raises(ServerError, match="no server runs for a deployment under") as caught:
        choose_server(b)
    assert (
        "; running elsewhere: " in caught.value.hint and f"127.0.0.1:9001 (pid {os.getpid()}, {a})" in caught.value.hint
    )
    _write_state(state_dir, _live(9201, deployment=b))
    with pytest.raises(UsageError, match=r"^2 servers run for deployments under .*here: ") as several:
        choose_server(tmp_path / "here")
    assert "127.0.0.1:9001" in several.value.message and "127.0.0.1:9201" in several.value.message
    assert "--url" in several.value.hint


def test_url_finds_the_local_server_or_stands_for_itself(state_dir: Path) -> None:
    _write_state(state_dir, _live(9001))
    assert current_server("localhost:9001").entry_model == "echo"
    assert current_server("http://127.0.0.1:9002").entry_model == "echo"  # its HTTP port
    remote = current_server("gpu-host:8001")
    assert (remote.grpc_url, remote.http_url, remote.pid) == ("gpu-host:8001", None, None)
    assert current_server("http://gpu-host:8000").http_url == "gpu-host:8000"
    with pytest.raises(ServerError, match="bad server URL"):
        current_server("gpu-host")


def test_nothing_to_stop_says_so_and_names_the_others(tmp_path: Path, state_dir: Path) -> None:
    here = f"nothing to stop: no trtdeploy server runs for a deployment under {tmp_path}"
    assert servers_to_stop(folder=tmp_path) == ([], here)
    assert servers_to_stop(port=8001)[1] == "nothing to stop: no trtdeploy server uses port 8001"
    assert servers_to_stop(all=True)[1] == "nothing to stop: no trtdeploy server runs"
    _write_state(state_dir, _live(9001, deployment=tmp_path / "elsewhere"))
    servers, nothing = servers_to_stop(deployment=tmp_path / "dep")
    assert servers == [] and nothing.startswith(f"nothing to stop: no trtdeploy server runs for {tmp_path / 'dep'}")
    assert "running elsewhere: 127.0.0.1:9001" in nothing and "trtdeploy stop DEPLOYMENT" in nothing
    with pytest.raises(UsageError, match="give one of DEPLOYMENT, --port and --all"):
        servers_to_stop(port=9001, all=True)


def test_stop_by_port_only_stops_that_server(state_dir: Path) -> None:
    sleepers = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    try:
        for port, proc in zip((9001, 9101), sleepers, strict=True):
            _write_state(state_dir, _live(port, pid=proc.pid))
        chosen, _ = servers_to_stop(port=9102)  # the second one's HTTP port
        assert [s.pid for s in chosen] == [sleepers[1].pid]
        stop_server(chosen[0])
        assert sleepers[1].wait(timeout=10) == -15 and sleepers[0].poll() is None
        assert [s.grpc_port for s in running_servers()] == [9001]
        every, _ = servers_to_stop(all=True)
        assert [s.pid for s in every] == [sleepers[0].pid]
        stop_server(every[0])
        assert sleepers[0].wait(timeout=10) == -15
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()


_GROUP = """
import subprocess, sys
marked = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                           "print(flush=True); time.sleep(60)", sys.argv[1]], stdout=subprocess.PIPE)
marked.stdout.readline()  # SIGTERM is ignored from here on
unmarked = subprocess.Popen(["sleep", "60"])
print(marked.pid, unmarked.pid, flush=True)
unmarked.wait()
"""


def test_the_sweep_kills_what_a_dead_server_left_and_nothing_else(tmp_path: Path, state_dir: Path) -> None:
    """A leftover counts only if it is in the server's process group and names its shm prefix or model repository."""
    prefix = f"trtdeploy-test-{uuid.uuid4().hex[:8]}-"
    region = Path("/dev/shm") / f"{prefix}region"
    leader = subprocess.Popen(
        [sys.executable, "-c", _GROUP, f"{prefix}stub"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    marked, unmarked = map(int, leader.stdout.readline().split())
    try:
        record = _write_state(
            state_dir, replace(_live(9001, pid=leader.pid), shm_prefix=prefix, model_repo=tmp_path / "repo")
        )
        region.write_bytes(b"x")
        leader.kill()
        leader.wait()
        with pytest.warns(ServerCleanupWarning) as caught:
            assert running_servers() == []
        assert str(caught[0].message) == (
            "the server on gRPC port 9001 (no deployment) had died; its record is removed: killed 1 leftover "
            "process, removed 1 shared-memory region"
        )
        assert wait_until(lambda: not process_alive(marked), timeout=10)
        assert process_alive(unmarked) and not record.exists() and shm_regions(prefix) == []
    finally:
        for pid in (marked, unmarked):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        region.unlink(missing_ok=True)


def test_records_are_private(state_dir: Path) -> None:
    folder = writable_servers_dir()
    assert folder.stat().st_mode & 0o777 == 0o700


def test_the_restricted_key_stays_out_of_output_but_in_the_record(state_dir: Path) -> None:
    info = ServerInfo(grpc_port=9001, pid=os.getpid(), restricted_apis=["trace"], restricted_key=("k", "secret"))
    assert "restricted_key" not in info.to_dict() and "secret" not in repr(info)
    assert ServerInfo.from_dict(info.to_dict(secrets=True)) == info
    assert info.restricted_headers("http") == {"k": "secret"}
    assert info.restricted_headers("grpc") == {"triton-grpc-protocol-k": "secret"}
    assert ServerInfo(grpc_port=9001).restricted_headers("http") == {}


def test_an_unwritable_state_folder_is_refused_before_the_server_starts(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(blocker))
    with pytest.raises(ServerError, match="cannot write server records") as info:
        writable_servers_dir()
    assert "TRTDEPLOY_STATE_DIR" in info.value.hint
