"""Shared fixtures: tiny random-weight checkpoints in the real layout, built deployments, and CLI runners."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtdeploy import plugins

# The Hub is never contacted from tests: a download attempt fails at once instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


#: The installed plugins a test sees when it names none: this repository's own, never another one installed beside.
#: ``@pytest.mark.plugins("qwen_llm")`` narrows a test to the plugins it names (none: the built-in engines only),
#: in this process and in the ``trtdeploy`` subprocesses it starts (TRTDEPLOY_LOAD_PLUGINS); a test whose result
#: depends on which plugins are installed (a listing, a recognized workload) names them.
REPOSITORY_PLUGINS = ("cosyvoice", "llama_llm", "qwen_llm", "spark_tts", "whisper")


@pytest.fixture(autouse=True)
def only_named_plugins(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    marker = request.node.get_closest_marker("plugins")
    names = REPOSITORY_PLUGINS if marker is None else marker.args
    with plugins.only_plugins(names):
        monkeypatch.setenv("TRTDEPLOY_LOAD_PLUGINS", ",".join(names))
        yield


@pytest.fixture(scope="session")
def qwen_checkpoint(trtdeploy_checkpoint) -> Path:
    """A tiny random-weight Qwen2 checkpoint (config, safetensors, tokenizer) written by the qwen_llm plugin."""
    return trtdeploy_checkpoint("qwen_llm")


def interruptible() -> None:
    """``preexec_fn`` of a command a test sends SIGINT to: the command takes Ctrl-C as one started at a terminal
    does, even where this test run ignores it (a job started in the background by a non-interactive shell is, and
    its children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300):
    """Run ``trtdeploy ARGS`` in a subprocess of this interpreter (the real console entry point)."""
    return subprocess.run(
        [sys.executable, "-m", "trtdeploy", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
