"""Fixtures for the server tests: an isolated cache and state folder, free ports."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtdeploy.server import ephemeral_ports


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory):
    """One backend cache for the session (the bundled backend folder is prepared once)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTDEPLOY_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state folder of this test's own, so tests never see each other's servers (or the user's).

    A server a failing test leaves behind is killed afterwards, found by its state file.
    """
    path = tmp_path / "state"
    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(path))
    yield path
    for state_file in path.glob("servers/*.json"):
        try:
            os.killpg(json.loads(state_file.read_text())["pgid"], signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


@pytest.fixture
def ports() -> list[int]:
    """Three distinct free ports (HTTP, gRPC, metrics)."""
    return ephemeral_ports()
