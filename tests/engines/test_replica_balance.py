"""Replicas of one model keep their requests in flight within one of each other through a shared file."""

from __future__ import annotations

import threading
import time

import pytest

from trtdeploy.engines.replica_balance import ReplicaBalance, shared_file


@pytest.fixture
def path(tmp_path):
    return tmp_path / "model.replicas"


def test_an_instance_ahead_of_the_least_busy_waits_until_it_is_not(path):
    first, second = ReplicaBalance(path, 0, 2, most_wait_s=30), ReplicaBalance(path, 1, 2, most_wait_s=30)
    first.take()
    first.take()  # 1 ahead of the other's 0 is within the slack
    assert first.in_flight == 2
    taken = threading.Event()
    waiting = threading.Thread(target=lambda: (first.take(), taken.set()))
    waiting.start()
    assert not taken.wait(0.3)  # 2 ahead: its request waits, so Triton gives the next ones to the other instance
    second.take()
    assert taken.wait(5)
    waiting.join()
    assert (first.in_flight, second.in_flight) == (3, 1)


def test_a_request_ending_lets_a_waiting_one_in(path):
    first, second = ReplicaBalance(path, 0, 2, most_wait_s=30), ReplicaBalance(path, 1, 2, most_wait_s=30)
    first.take()
    first.take()
    taken = threading.Event()
    waiting = threading.Thread(target=lambda: (first.take(), taken.set()))
    waiting.start()
    assert not taken.wait(0.3)
    first.done()
    assert taken.wait(5)
    waiting.join()
    assert first.in_flight == 2 and second.in_flight == 0


def test_the_least_busy_never_waits_and_a_wait_is_capped(path):
    first, second = ReplicaBalance(path, 0, 2, most_wait_s=0.2), ReplicaBalance(path, 1, 2)
    for _ in range(3):
        second.take()
    started = time.monotonic()
    first.take()  # behind: at once
    assert time.monotonic() - started < 0.1
    for _ in range(4):
        first.take()  # the last ones wait, each at most the cap
    assert time.monotonic() - started < 5
    assert first.in_flight == 5


def test_an_instance_alone_or_among_absent_ones_never_waits(path):
    alone = ReplicaBalance(path, 2, 4, most_wait_s=30)
    started = time.monotonic()
    for _ in range(10):
        alone.take()
    assert time.monotonic() - started < 1


def test_the_last_instance_to_leave_removes_the_file(path):
    first, second = ReplicaBalance(path, 0, 2), ReplicaBalance(path, 1, 2)
    first.take()
    first.close()
    assert path.exists()
    second.close()
    assert not path.exists()


def test_a_slot_outside_the_replicas_is_refused(path):
    with pytest.raises(ValueError, match="slot 2 is outside 0..1"):
        ReplicaBalance(path, 2, 2)


def test_the_file_is_named_by_server_and_model():
    assert shared_file(1234, "tensorrt_llm").name == "trtdeploy-1234-tensorrt_llm.replicas"
