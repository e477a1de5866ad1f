"""The client-overhead bench runs (tiny sizes): it keeps working as the load generator changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench" / "client_overhead.py"


@pytest.mark.server
def test_client_overhead_bench_runs():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "320", "--concurrency", "8", "--chunks", "4", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("perf/bare") == 4
    assert "echo_decoupled" in done.stdout and "chunks/s" in done.stdout
