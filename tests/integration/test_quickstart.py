"""`trtdeploy quickstart`: the main job end to end offline (random weights), and a clean stop when it is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ..conftest import run_cli
from ..server.helpers import leftovers

pytestmark = pytest.mark.server


def test_quickstart_runs_every_stage_on_random_weights_when_the_hub_is_unreachable(tmp_path):
    env = {"TRTDEPLOY_STATE_DIR": str(tmp_path / "state")}
    result = run_cli("quickstart", "--gpu", "cpu", "--concurrency", "1,2", "--json", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "the Hub is unreachable" in result.stderr and result.stderr.count("Hub") == 1
    summary = json.loads(result.stdout)
    assert summary["random_weights"] is True
    assert [level["concurrency"] for level in summary["levels"]] == [1, 2]
    assert all(level["errors"] == 0 and level["output_token_throughput"] > 0 for level in summary["levels"])
    assert (tmp_path / "quickstart" / "perf-results" / "random-weights" / "summary.json").is_file()
    assert not list((tmp_path / "state" / "servers").glob("*.json"))  # the server was stopped


def test_sigterm_during_quickstart_leaves_no_server(tmp_path):
    env = {**os.environ, "TRTDEPLOY_STATE_DIR": str(tmp_path / "state")}
    process = subprocess.Popen(
        [sys.executable, "-m", "trtdeploy", "quickstart", "--gpu", "cpu", "--concurrency", "1,2,4,4,4,4"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in process.stderr:  # wait until the server is up and perf runs
        lines.append(line)
        if "4/4 perf" in line:
            break
    records = list((tmp_path / "state" / "servers").glob("*.json"))
    assert len(records) == 1, lines  # while it runs, `trtdeploy stop` can find it
    pgid = json.loads(records[0].read_text())["pgid"]
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode != 0
    assert leftovers(pgid=pgid) == [] and leftovers(mentioning=tmp_path) == []
