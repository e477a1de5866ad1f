"""Requests in flight kept even across the replicas of one model: its instances on different GPUs.

Triton hands a request to the first instance whose ``execute`` is not running. The contract's ``execute`` returns
as soon as it has handed its requests to the generator, so the first instance is nearly always free and takes
nearly every request, while the other GPUs idle. Each instance therefore publishes its count of requests in flight
in a small shared file, one slot per instance, and ``execute`` waits before taking on a request while its instance
holds more than one more than the least busy of the others: meanwhile Triton gives the next requests to the others.
The least busy instance never waits, so some instance always takes requests; a wait is capped, so a replica that
stops answering holds no request for long.

The slots are whole 8-byte integers in a memory-mapped file (0: no instance there; n + 1: n requests in flight),
each written by its own instance only: a reader sees each slot whole.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

#: How far ahead of the least busy replica an instance may be before it waits.
SLACK = 1
#: The longest a request waits for its instance's turn (s).
MOST_WAIT_S = 0.05
#: How often a waiting request looks again (s).
POLL_S = 0.0002


def shared_file(server_pid: int, model: str) -> Path:
    """The file the instances of ``model`` in the server of process ``server_pid`` share (in /dev/shm where it
    exists: the python backend needs it anyway)."""
    folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return folder / f"trtdeploy-{server_pid}-{model}.replicas"


class ReplicaBalance:
    """One instance's share of the file at ``path``: ``slot`` of ``slots``."""

    def __init__(self, path: Path, slot: int, slots: int, *, most_wait_s: float = MOST_WAIT_S):
        if not 0 <= slot < slots:
            raise ValueError(f"replica slot {slot} is outside 0..{slots - 1}")
        self.path = path
        self.slot = slot
        self.most_wait_s = most_wait_s
        size = slots * 8
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(descriptor).st_size < size:
                os.ftruncate(descriptor, size)
            self._map = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        self._slots = np.frombuffer(self._map, dtype=np.int64, count=slots)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._slots[slot] = 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def _behind_the_least_busy(self) -> bool:
        others = np.delete(self._slots, self.slot)
        present = others[others > 0]
        return not len(present) or self._in_flight <= int(present.min()) - 1 + SLACK

    def take(self) -> None:
        """Wait for this instance's turn (at most ``most_wait_s``), then count one more request in flight."""
        deadline = time.monotonic() + self.most_wait_s
        while not self._behind_the_least_busy() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        self._add(1)

    def done(self) -> None:
        """Count one request fewer in flight (it sent its final response)."""
        self._add(-1)

    def _add(self, change: int) -> None:
        with self._lock:
            self._in_flight += change
            self._slots[self.slot] = self._in_flight + 1

    def close(self) -> None:
        """Leave the file (the last instance to leave removes it)."""
        self._slots[self.slot] = 0
        alone = not self._slots.any()
        del self._slots
        self._map.close()
        if alone:
            self.path.unlink(missing_ok=True)
