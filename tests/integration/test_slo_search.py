"""`perf --find max-concurrency` on a tiny random Qwen2 served by the real tritonserver (torch engine, CPU).

The deployment holds one sequence at a time (max batch size 1), and every request generates exactly 1024 tokens
(--ignore-eos). The SLO bounds the time to first token by 0.35 x the median time T of a whole request at
concurrency 1, measured first on this machine (from 250 ms to over a second on the machines seen), for 75% of a
level's requests:

- at concurrency 1 a request gets the slot at once: its first token comes after the prompt's prefill and a step,
  10 to 30 ms here; both that and the limit are CPU work and scale together on a slower machine. What does not
  scale is a stall, the process descheduled: with another process spinning on one of the two cores, first tokens
  came up to about 130 ms late, a few per level, which is why the requests are long and why a quarter of them may
  miss the limit;
- at concurrency 2, in closed loop, a request is sent when the one before it on its worker finishes, which is when
  the other worker's waiting request takes the slot: every request but the first waits a whole T for its own
  first token, about three times the limit, and the level cannot meet it. Nothing here depends on how the two
  requests' times interleave (with two slots and three requests, how long a request waits for a slot depends on
  when the two running ones started, and a level above the answer once reached 75%).

So the answer is 1 whatever the machine's speed, and the separate runs at 1 and 2 agree. The doubling and
bisection of longer searches are checked against a model of the levels in tests/perf/test_search.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import run_cli

pytestmark = pytest.mark.server

OSL = 1024


@pytest.fixture(scope="module")
def served(trtdeploy_deploy, trtdeploy_serve):
    deployment = trtdeploy_deploy("qwen_llm", mode="streaming", max_batch_size=1, max_input_len=64, max_output_len=OSL)
    return deployment, trtdeploy_serve(deployment)


def perf(served, tmp_path: Path, name: str, *args: str) -> dict:
    """``trtdeploy perf`` of the served deployment; its summary (also the one written to summary.json)."""
    deployment, server = served
    out = tmp_path / name
    done = run_cli(
        "perf", str(deployment.path), "--url", server.grpc_url, "--isl", "16", "--osl", str(OSL), "--ignore-eos",
        *args, "--output-dir", str(out), "--no-plots", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    return summary


def test_find_max_concurrency_agrees_with_the_levels_below_and_above(served, tmp_path):
    (alone,) = perf(served, tmp_path, "alone", "-c", "1", "--num-requests", "6")["levels"]
    limit = round(0.35 * alone["e2e_ms"]["p50"], 1)
    slo = ["--slo", f"ttft_ms<={limit}", "--attainment", "0.75"]

    found = perf(served, tmp_path, "find", "--find", "max-concurrency", *slo)
    search = found["search"]
    attained = [(level["concurrency"], level["attainment"]) for level in found["levels"]]
    assert (search["found"], search["lowest_failed"]) == (1, 2), (limit, attained)
    tried = [(level["concurrency"], level["slo_met"]) for level in found["levels"]]
    assert tried == [(1, True), (2, False)]
    assert found["levels"][search["level"]]["concurrency"] == 1
    assert all(level["status"] == "complete" and level["errors"] == 0 for level in found["levels"])

    (below,) = perf(served, tmp_path, "below", "-c", "1", *slo)["levels"]
    (above,) = perf(served, tmp_path, "above", "-c", "2", *slo)["levels"]
    assert below["slo_met"] is True and below["attainment"] >= 0.75
    assert above["slo_met"] is False and above["attainment"] <= 1 / 16, (limit, above["ttft_ms"])
