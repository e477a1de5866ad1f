"""serve_deployment's bookkeeping: one log per server, one start per deployment at a time."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trtdeploy.deployment import Deployment
from trtdeploy.errors import ServerError
from trtdeploy.server import new_log_file, serve_deployment
from trtdeploy.server._serve import _starting

from .helpers import write_deployment


def test_each_server_gets_a_log_of_its_own_and_the_link_follows_the_newest(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tritonserver.log").write_text("a log of an older trtdeploy\n")
    os.utime(logs / "tritonserver.log", (1_000_000_000, 1_000_000_000))
    made = [new_log_file(logs) for _ in range(3)]  # within a second, as a rule
    assert len(set(made)) == 3 and all(p.is_file() and p.read_text() == "" for p in made)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(1_000_000_000))
    assert (logs / f"tritonserver-{stamp}.log").read_text() == "a log of an older trtdeploy\n"
    link = logs / "tritonserver.log"
    assert link.is_symlink() and os.readlink(link) == made[-1].name
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        [*(p.name for p in made), f"tritonserver-{stamp}.log", "tritonserver.log"]
    )


def test_a_deployment_being_started_is_not_started_twice(tmp_path: Path) -> None:
    dep = Deployment.load(write_deployment(tmp_path / "dep", "echo"))
    with _starting(dep.path):
        with pytest.raises(ServerError, match=f"a server for {dep.path} is being started"):
            serve_deployment(dep)
    assert not (dep.logs_dir).exists()  # refused before anything was written


def test_serve_records_how_long_the_deployment_took_to_load(tmp_path: Path, state_dir: Path) -> None:
    """Beside the manifest, for `export k8s` to size its startup probe with."""
    dep = Deployment.load(write_deployment(tmp_path / "dep", "echo"))
    server, _ = serve_deployment(dep, background=True)
    server.stop()
    (record,) = dep.load_times
    assert record["seconds"] > 0 and set(record) == {"at", "seconds"}
