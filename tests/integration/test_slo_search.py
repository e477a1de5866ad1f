"""`perf --find max-concurrency` on a tiny random Qwen2 served by the real tritonserver (torch engine, CPU).

The deployment holds at most 2 sequences at a time (max batch size 2), and every request generates exactly 1024
tokens (--ignore-eos). The SLO bounds the time to first token by 0.4 x the median time of a whole request at
concurrency 1, measured first on this machine (200 to 300 ms here), for 75% of a level's requests:

- at concurrency 1 or 2 every request gets a sequence slot at once: its first token comes after the prompt's
  prefill and a step, 10 to 20 ms here; both that and the limit are CPU work and scale together on a slower
  machine. What does not scale is a stall, the process descheduled: with another process spinning on one of the
  two cores, first tokens came up to about 130 ms late, a few per level, which is why the requests are long
  (a shorter limit was missed there) and why a quarter of them may miss it;
- at concurrency 3 a request sent while both slots are busy waits for one of them to finish: in closed loop each
  finish sends a request that waits for the next finish, and the two slots' finishes come in turn, two gaps per
  time of a request running beside another. The two gaps add up to that time, longer than a request's time
  alone (1.6 x here), so at least one gap of each two is longer than the limit: at most about half the requests
  meet it (9 of 16 here, 1 of 16 with the spinning process), and the level cannot reach 75%. At 4, two
  requests wait, longer.

So the answer is 2 whatever the machine's speed, and the separate runs at 2 and 3 agree.
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
    deployment = trtdeploy_deploy("qwen_llm", mode="streaming", max_batch_size=2, max_input_len=64, max_output_len=OSL)
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
    limit = round(0.4 * alone["e2e_ms"]["p50"], 1)
    slo = ["--slo", f"ttft_ms<={limit}", "--attainment", "0.75"]

    found = perf(served, tmp_path, "find", "--find", "max-concurrency", *slo)
    search = found["search"]
    attained = [(level["concurrency"], level["attainment"]) for level in found["levels"]]
    assert (search["found"], search["lowest_failed"]) == (2, 3), (limit, attained)
    tried = [(level["concurrency"], level["slo_met"]) for level in found["levels"]]
    assert tried == [(1, True), (2, True), (4, False), (3, False)]  # doubling to 4, then one bisection step
    assert found["levels"][search["level"]]["concurrency"] == 2
    assert all(level["status"] == "complete" and level["errors"] == 0 for level in found["levels"])

    (below,) = perf(served, tmp_path, "below", "-c", "2", *slo)["levels"]
    (above,) = perf(served, tmp_path, "above", "-c", "3", *slo)["levels"]
    assert below["slo_met"] is True and below["attainment"] >= 0.75
    assert above["slo_met"] is False and above["attainment"] < 0.75
