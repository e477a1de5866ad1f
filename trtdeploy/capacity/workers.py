"""Simulations side by side in forked worker processes, where the machine has cores to spare.

A simulation is one Python loop (least-requests takes each request in turn), so a second core cannot speed one up,
but it can run the next: the replica search judges a count behind several balancers, and around its answer two
counts at once. Jobs come in groups (a replica count on one load); a job whose result fails its group (a balancer
that misses the SLO) drops the group's jobs still waiting and stops those running, as trying them one after another
would never have started them."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import traceback
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..errors import TrtDeployError

T = TypeVar("T")

#: The most simulations run at once: each may hold gigabytes (see plan.MAX_SIMULATED_REQUESTS), and the search
#: never has more than a few worth running together.
MAX_WORKERS = 4
#: prctl's option that sends a child a signal when its parent ends (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Job(Generic[T]):
    """One simulation: the group it judges, and the call that runs it (in a forked child: nothing is pickled but
    its result)."""

    group: Hashable
    run: Callable[[], T]


def available_workers(bytes_each: int) -> int:
    """The simulations of ``bytes_each`` bytes of memory each this process may run at once: its usable cores (its
    CPU affinity, and its cgroup's CPU quota where one is set), no more than the memory available holds beside this
    process, up to MAX_WORKERS; 1 where processes cannot be forked."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    memory = _available_memory()
    if memory is not None:
        cores = min(cores, int(memory * 0.8) // max(1, bytes_each))
    return max(1, min(cores, MAX_WORKERS))


def _cgroup_cpus() -> float | None:
    """The CPUs a cgroup v2 quota (``cpu.max``) grants this process, None without one."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def run_jobs(jobs: Sequence[Job[T]], passed: Callable[[T], bool], workers: int) -> dict[int, T]:
    """Each job's result by its index in ``jobs``, started in that order, at most ``workers`` at once (one: in turn,
    in this process). Once a job's result has not ``passed``, the jobs of its group are not started, and those
    running are stopped; they have no result."""
    workers = min(workers, len(jobs))
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
                process = context.Process(target=_work, args=(job.run, sender, os.getpid()), daemon=True)
                process.start()
                sender.close()
                running[receiver] = (index, process)
            if not running:  # what waited belonged to failed groups
                break
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


def _work(run: Callable[[], Any], sender: Connection, parent: int) -> None:
    _die_with_parent(parent)
    try:
        sender.send((True, run()))
    except BaseException:  # noqa: BLE001 - the parent re-raises it with the child's traceback
        sender.send((False, traceback.format_exc()))


def _die_with_parent(parent: int) -> None:
    """Have Linux stop this worker when the process that forked it ends, however it ends (a SIGKILL leaves no
    ``finally`` to stop it); elsewhere, nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before prctl took hold
        os._exit(1)


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
