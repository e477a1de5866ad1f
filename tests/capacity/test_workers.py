"""Simulations side by side in forked workers: the same answers as in turn, a failed group's other jobs stopped, and a
worker's failure or death reported, with nothing left running."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from trtdeploy.capacity import Load, plan
from trtdeploy.capacity.workers import Job, available_workers, run_jobs
from trtdeploy.errors import TrtDeployError

from .runs import busier_is_slower_curve

plan_module = sys.modules["trtdeploy.capacity.plan"]

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")


def _value(value):
    return lambda: value


def _started(path: Path) -> None:
    """Wait until the job of ``path`` has written its pid."""
    while not path.exists():
        time.sleep(0.01)


def _sleep_then_mark(path: Path, seconds: float):
    def run():
        path.with_suffix(".tmp").write_text(str(os.getpid()))
        path.with_suffix(".tmp").rename(path)  # whole, or not there
        time.sleep(seconds)
        path.with_suffix(".done").write_text("")
        return True

    return run


@pytest.mark.parametrize("workers", [1, 3])
def test_a_group_stops_at_its_first_failed_job(workers):
    jobs = [Job("a", _value(1)), Job("b", _value(-1)), Job("a", _value(2)), Job("b", _value(3)), Job("c", _value(4))]
    results = run_jobs(jobs, lambda value: value > 0, workers)
    assert results[0] == 1 and results[1] == -1 and results[2] == 2 and results[4] == 4
    if workers == 1:
        assert 3 not in results  # never started: its group had failed
    else:
        assert results.get(3, 3) == 3  # started only if a worker freed up before b's failure came


def test_the_running_jobs_of_a_failed_group_are_stopped(tmp_path):
    slow = tmp_path / "slow.pid"

    def fail_later():
        _started(slow)
        return False

    jobs = [Job("g", _sleep_then_mark(slow, 60)), Job("g", fail_later), Job("h", _value(True))]
    started = time.monotonic()
    results = run_jobs(jobs, bool, 3)
    assert time.monotonic() - started < 30  # the 60-s job did not run to its end
    assert results == {1: False, 2: True}
    assert not slow.with_suffix(".done").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(int(slow.read_text()), 0)  # stopped and reaped


def test_an_exception_in_a_worker_is_raised_with_its_traceback():
    def boom():
        raise ValueError("bad draw")

    with pytest.raises(RuntimeError, match="ValueError: bad draw"):
        run_jobs([Job("g", boom), Job("h", _value(True))], bool, 2)


def test_a_worker_that_dies_is_one_line_with_a_hint(tmp_path):
    slow = tmp_path / "slow.pid"

    def die():
        _started(slow)
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(TrtDeployError, match=r"exit code -9") as raised:
        run_jobs([Job("g", _sleep_then_mark(slow, 60)), Job("h", die)], bool, 2)
    assert "--duration" in raised.value.hint
    with pytest.raises(ProcessLookupError):
        os.kill(int(slow.read_text()), 0)  # the other worker did not outlive the failure


def test_a_failure_that_leaves_only_its_own_group_waiting_ends_the_run():
    """Two workers, three jobs of one group: the first fails, the second is stopped, the third never starts."""
    started = time.monotonic()
    results = run_jobs([Job("g", _value(False)), Job("g", lambda: time.sleep(60)), Job("g", _value(True))], bool, 2)
    assert results == {0: False}
    assert time.monotonic() - started < 30


def test_available_workers_are_the_usable_cores_and_memory_up_to_the_cap():
    assert 1 <= available_workers(1) <= min(len(os.sched_getaffinity(0)), 4)
    assert available_workers(2**60) == 1  # no memory holds two such simulations


def test_a_plan_judged_side_by_side_is_the_plan_judged_in_turn(monkeypatch):
    curve = busier_is_slower_curve("e2e_ms_p99<=3500")
    rate = 6 * curve.best.throughput
    options = {"balancing": ("round-robin", "least-requests"), "headroom": 0, "load": Load(rate, duration_s=1500)}
    monkeypatch.setattr(plan_module, "_SCOUT_REQUESTS", 2000)
    in_turn = plan(curve, rate, **options)
    monkeypatch.setattr(plan_module, "_SIDE_BY_SIDE_FROM", 0)
    monkeypatch.setattr(plan_module, "available_workers", lambda bytes_each: 3)
    said: list[str] = []
    side_by_side = plan(curve, rate, say=said.append, **options)
    assert in_turn.tried[0] == (6, False)  # the search ran
    assert side_by_side.replicas == in_turn.replicas
    assert side_by_side.simulated == in_turn.simulated
    assert side_by_side.scouted == in_turn.scouted
    assert set(in_turn.tried) <= set(side_by_side.tried)
    assert f"{in_turn.replicas} replicas: SLO met" in said
    assert said[0].startswith("simulating 6 replicas over ") and said[0].endswith("(scouting) behind round-robin")
    assert any(line.endswith(" s of load behind round-robin, least-requests") for line in said)
