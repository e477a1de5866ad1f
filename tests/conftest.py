"""Shared fixtures: tiny random-weight checkpoints in the real layout, built deployments, and CLI runners."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The Hub is never contacted from tests: a download attempt fails at once instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def qwen_checkpoint(trtdeploy_checkpoint) -> Path:
    """A tiny random-weight Qwen2 checkpoint (config, safetensors, tokenizer) written by the qwen_llm plugin."""
    return trtdeploy_checkpoint("qwen_llm")


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
