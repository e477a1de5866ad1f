"""Helpers of python models that need no server: CallAhead."""

from __future__ import annotations

import threading

import pytest

from trtdeploy.backend_utils import CallAhead


def test_call_ahead_runs_beside_the_caller_and_hands_back_the_answer():
    ahead = CallAhead()
    started, release = threading.Event(), threading.Event()

    def call(value):
        started.set()
        assert release.wait(5)
        return value * 2

    ahead.start(call, 21)
    assert started.wait(5)  # running while the caller goes on
    release.set()
    assert ahead.result() == 42


def test_call_ahead_raises_the_calls_error_and_refuses_misuse():
    ahead = CallAhead()

    def fail():
        raise RuntimeError("llm: boom")

    ahead.start(fail)
    with pytest.raises(RuntimeError, match="llm: boom"):
        ahead.result()
    with pytest.raises(RuntimeError, match="no call was started"):
        ahead.result()
    release = threading.Event()
    ahead.start(release.wait, 5)
    with pytest.raises(RuntimeError, match="still in flight"):
        ahead.start(release.wait, 5)
    release.set()
    ahead.drain()


def test_drain_waits_for_the_call_in_flight_and_drops_its_outcome():
    ahead = CallAhead()
    finished = threading.Event()

    def slow_failure():
        finished.wait(0.2)
        finished.set()
        raise RuntimeError("dropped")

    ahead.start(slow_failure)
    ahead.drain()
    assert finished.is_set()  # nothing runs on after drain
    ahead.drain()  # nothing in flight: nothing to do
    ahead.start(lambda: "again")
    assert ahead.result() == "again"
