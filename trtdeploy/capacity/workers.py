"""Simulations side by side in forked worker processes, where the machine has cores to spare.

A simulation is one Python loop (least-requests takes each request in turn), so a second core cannot speed one up,
but it can run the next: the replica search judges a count behind several balancers, and around its answer two
counts at once. Jobs come in groups (a replica count on one load); a job whose result fails its group (a balancer
that misses the SLO) drops the group's jobs still waiting and stops those running, as trying them one after another
would never have started them."""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

from ..errors import TrtDeployError

T = TypeVar("T")

#: The most simulations run at once: each may hold gigabytes (see plan.MAX_SIMULATED_REQUESTS), and the search
#: never has more than a few worth running together.
MAX_WORKERS = 4


@dataclass(frozen=True)
class Job(Generic[T]):
    """One simulation: the group it judges, and the call that runs it (in a forked child: nothing is pickled but
    its result)."""

    group: Hashable
    run: Callable[[], T]


def available_workers() -> int:
    """The simulations this process may run at once: its usable cores, up to MAX_WORKERS; 1 where processes
    cannot be forked."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def run_jobs(jobs: Sequence[Job[T]], passed: Callable[[T], bool], workers: int) -> dict[int, T]:
    """Each job's result by its index in ``jobs``, started in that order, at most ``workers`` at once (one: in turn,
    in this process). Once a job's result has not ``passed``, the jobs of its group are not started, and those
    running are stopped; they have no result."""
    if workers <= 1:
        return _in_turn(jobs, passed)
    context = multiprocessing.get_context("fork")
    waiting = deque(enumerate(jobs))
    running: dict[Connection, tuple[int, Any]] = {}
    failed: set[Hashable] = set()
    results: dict[int, T] = {}
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                index, job = waiting.popleft()
                if job.group in failed:
                    continue
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_work, args=(job.run, sender), daemon=True)
                process.start()
                sender.close()
                running[receiver] = (index, process)
            for receiver in wait(list(running)):
                if receiver not in running:  # a sibling of a group that failed just before: stopped
                    continue
                index, process = running.pop(receiver)
                results[index] = _result_of(receiver, process)
                if not passed(results[index]):
                    failed.add(jobs[index].group)
                    for other, (sibling, _) in list(running.items()):
                        if jobs[sibling].group in failed:
                            _stop(other, running.pop(other)[1])
    finally:
        for receiver, (_, process) in running.items():
            _stop(receiver, process)
    return results


def _in_turn(jobs: Sequence[Job[T]], passed: Callable[[T], bool]) -> dict[int, T]:
    failed: set[Hashable] = set()
    results: dict[int, T] = {}
    for index, job in enumerate(jobs):
        if job.group not in failed:
            results[index] = job.run()
            if not passed(results[index]):
                failed.add(job.group)
    return results


def _work(run: Callable[[], Any], sender: Connection) -> None:
    try:
        sender.send((True, run()))
    except BaseException:  # noqa: BLE001 - the parent re-raises it with the child's traceback
        sender.send((False, traceback.format_exc()))


def _result_of(receiver: Connection, process: Any) -> Any:
    try:
        returned, value = receiver.recv()
    except EOFError:
        process.join()
        raise TrtDeployError(
            f"a simulation worker ended without its result (exit code {process.exitcode}; -9 is often the kernel "
            "stopping it for memory)",
            hint="a shorter --duration or a lower --target-rate simulates fewer requests",
        ) from None
    finally:
        receiver.close()
    process.join()
    if not returned:
        raise RuntimeError(f"a simulation failed in its worker process:\n{value}")
    return value


def _stop(receiver: Connection, process: Any) -> None:
    process.kill()
    process.join()
    receiver.close()
