"""Every load shape end to end: `trtdeploy perf` against the fake token-contract LLM on the real tritonserver, with
the shape checked from what the run wrote (requests.jsonl: each request's send time ``start_ms``, its lag behind
its due time ``lag_ms``, ``e2e_ms`` and token counts; summary.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trtdeploy.errors import UsageError
from trtdeploy.perf.llm import load_tokenizer
from trtdeploy.perf.loadgen import arrival_offsets, arrival_seed, arrivals_within

from .test_trace import write_trace


def perf(fake_server, deployment: Path, out: Path, *args: str) -> tuple[dict, list[dict]]:
    """Run `trtdeploy perf` on the fake server's ``tensorrt_llm`` (2 ms a token, streamed) as ``deployment``: the
    summary and the measured requests of requests.jsonl."""
    from trtdeploy.cli.main import main

    with pytest.raises(SystemExit) as caught:
        main(
            ["perf", str(deployment), "--url", fake_server.grpc_url, "--model", "tensorrt_llm", "--no-plots"]
            + ["--output-dir", str(out), *args]
        )
    assert caught.value.code == 0
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), [row for row in requests if not row["warmup"]]


def rate_and_cv(times_s: np.ndarray) -> tuple[float, float]:
    """The mean rate of events at ``times_s`` and the coefficient of variation of their gaps."""
    gaps = np.diff(np.sort(times_s))
    return 1 / gaps.mean(), gaps.std() / gaps.mean()


def peak_in_flight(requests: list[dict]) -> int:
    """The most requests in flight at once, from their [start, start + e2e] intervals."""
    events = sorted(
        [(row["start_ms"], 1) for row in requests] + [(row["start_ms"] + row["e2e_ms"], -1) for row in requests]
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.server
@pytest.mark.parametrize(("arrival", "burstiness"), [("constant", 1.0), ("gamma", 0.25)])
def test_open_loop_sends_keep_the_rate_and_burstiness_and_stop_at_the_duration(
    fake_server, make_deployment, tmp_path, arrival, burstiness
):
    """10 requests/s for 4 s. The requests were due at the arrivals drawn for the level (their due times, send
    time less lag, are those draws), and were sent at their rate (within 10%; constant gaps: 10/s itself) and with
    their spread (the coefficient of variation of the gaps: 0 for constant gaps, about 1/sqrt(0.25) = 2 for these
    gamma gaps, whose draws the loadgen tests check over many); every arrival due within the 4 s was sent, and
    nothing after them."""
    args = ["--request-rate", "10", "--arrival", arrival, "--duration", "4", "--isl", "8", "--osl", "1"]
    if arrival == "gamma":
        args += ["--burstiness", str(burstiness)]
    summary, requests = perf(fake_server, make_deployment(), tmp_path / "out", *args, "--seed", "5")
    (level,) = summary["levels"]
    assert summary["arrival"] == {"process": arrival, "burstiness": burstiness, "max_concurrency": 0}
    seed = arrival_seed(5, 0, warmup=False)
    count = arrivals_within(4.0, 10.0, arrival=arrival, burstiness=burstiness, seed=seed)
    assert level["planned_requests"] == level["requests"] == len(requests) == count and level["errors"] == 0
    drawn = np.array(arrival_offsets(count, 10.0, arrival=arrival, burstiness=burstiness, seed=seed)) / 1e9
    due = np.sort([row["start_ms"] - row["lag_ms"] for row in requests]) / 1e3
    assert due - due[0] == pytest.approx(drawn - drawn[0], abs=1e-5)
    sent = np.array([row["start_ms"] for row in requests]) / 1e3
    (rate, cv), (drawn_rate, drawn_cv) = rate_and_cv(sent), rate_and_cv(drawn)
    assert abs(rate / drawn_rate - 1) < 0.1 and abs(cv - drawn_cv) < 0.15 + 0.1 * drawn_cv
    if arrival == "constant":
        assert abs(rate / 10 - 1) < 0.1 and cv < 0.15
    else:
        assert drawn_cv > 1.5  # bursty indeed
    # the phase started when the first arrival was due less its offset; nothing went out after its 4 s
    assert sent.max() - (due[0] - drawn[0]) <= 4 + 0.1


@pytest.mark.server
def test_a_capped_rate_never_has_more_requests_in_flight(fake_server, make_deployment, tmp_path):
    """200 requests/s of 10 streamed tokens (20 ms and more each) would have 4 and more in flight; capped at 2, the
    others wait for a slot, and their wait shows as lag."""
    args = ["--request-rate", "200", "--arrival", "constant", "--max-concurrency", "2", "--num-requests", "16"]
    summary, requests = perf(fake_server, make_deployment(), tmp_path / "out", *args, "--isl", "8", "--osl", "10")
    assert summary["arrival"]["max_concurrency"] == 2 and summary["levels"][0]["errors"] == 0
    assert len(requests) == 16 and peak_in_flight(requests) == 2
    assert max(row["lag_ms"] for row in requests) > 20


@pytest.mark.server
def test_a_closed_loop_for_a_duration_sends_nothing_after_it(fake_server, make_deployment, tmp_path):
    summary, requests = perf(
        fake_server, make_deployment(), tmp_path / "out", "-c", "2", "--duration", "1", "--isl", "8", "--osl", "4"
    )
    sent = [row["start_ms"] / 1e3 for row in requests]
    assert summary["levels"][0]["duration_limit_s"] == 1.0 and len(requests) > 2
    assert max(sent) - min(sent) <= 1.0 + 0.1  # the first send opens the phase
    assert peak_in_flight(requests) <= 2


@pytest.mark.server
def test_shared_prefixes_reach_the_server_at_their_lengths(fake_server, make_deployment, tmp_path):
    args = ["--shared-prefixes", "2", "--prefix-len", "6", "--isl", "8", "--osl", "2", "-c", "2", "--num-requests", "8"]
    summary, requests = perf(fake_server, make_deployment(max_input_len=14), tmp_path / "out", *args)
    assert summary["input"] == "synthetic isl=8, 2 shared prefixes of 6 tokens before them"
    assert [row["input_tokens"] for row in requests] == [14] * 8 and summary["levels"][0]["errors"] == 0


@pytest.mark.server
def test_a_trace_is_replayed_at_its_times_and_lengths(fake_server, make_deployment, tmp_path, capsys):
    """The trace's 12 requests over 1.1 s, twice as fast: each is due at its offset / 2 and sent then (within the
    lag the run records); prompts and answers of the trace's lengths, clipped to max_input_len 16 and
    max_output_len 6."""
    timestamps = [0, 40, 45, 200, 210, 215, 500, 620, 900, 905, 1000, 1100]
    lengths = [(10, 3), (12, 6), (20, 2), (4, 8), (16, 1), (9, 0), (13, 5), (30, 2), (8, 4), (15, 3), (6, 6), (11, 2)]
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [
            {"timestamp": 7000 + at, "input_length": isl, "output_length": osl, "hash_ids": [0, 1 + i % 3, 9 + i]}
            for i, (at, (isl, osl)) in enumerate(zip(timestamps, lengths, strict=True))
        ],
    )
    deployment = make_deployment(max_input_len=16, max_output_len=6)
    args = ["--trace", str(trace), "--trace-speedup", "2", "--trace-block-size", "4"]
    summary, requests = perf(fake_server, deployment, tmp_path / "out", *args)
    assert "clipped to them: trace" in " ".join(capsys.readouterr().err.split())
    assert summary["input"].endswith("clipped: 2 prompts to max_input_len 16, 1 answers to max_output_len 6")
    assert summary["arrival"]["process"] == "trace" and summary["options"]["ignore_eos"] is True
    (level,) = summary["levels"]
    assert level["request_rate"] == pytest.approx(11 / 0.55) and level["errors"] == 0
    requests.sort(key=lambda row: row["row"])
    assert [row["row"] for row in requests] == list(range(12))
    due_ms = [row["start_ms"] - row["lag_ms"] for row in requests]
    assert [due - due_ms[0] for due in due_ms] == pytest.approx([at / 2 for at in timestamps], abs=0.01)
    assert max(row["lag_ms"] for row in requests) < 50
    assert [row["input_tokens"] for row in requests] == [min(isl, 16) for isl, _ in lengths]
    assert [row["output_tokens"] for row in requests] == [min(max(osl, 1), 6) for _, osl in lengths]


@pytest.mark.server
def test_output_lengths_come_from_the_references(fake_server, make_deployment, tiny_tokenizer, tmp_path, capsys):
    references = ["the quick brown fox", "hello", "triton serves large language models and speech models", "a b"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"input": f"question {i}", "output": ref}) + "\n" for i, ref in enumerate(references))
    )
    tokenizer = load_tokenizer(tiny_tokenizer)
    counts = [len(tokenizer.encode(ref, add_special_tokens=False)) for ref in references]
    assert max(counts) > 8 > min(counts)
    summary, requests = perf(
        fake_server,
        make_deployment(max_output_len=8),
        tmp_path / "out",
        *("--input-data", str(rows), "--osl-from-reference", "--num-requests", "4", "--warmup", "0"),
    )
    longer = sum(count > 8 for count in counts)
    warning = f"{longer} of the 4 reference outputs are longer than this deployment's max_output_len 8"
    assert warning in " ".join(capsys.readouterr().err.split())
    assert summary["input"] == f"{rows} (output lengths from the references)" and summary["options"]["ignore_eos"]
    requests.sort(key=lambda row: row["row"])
    assert [row["output_tokens"] for row in requests] == [min(count, 8) for count in counts]


def test_reference_lengths_are_counted_and_fitted_to_the_deployment(make_deployment, tiny_tokenizer):
    from trtdeploy.benchmark import lengths_from_references
    from trtdeploy.deployment import Deployment
    from trtdeploy.perf.llm import TokenLLMWorkload
    from trtdeploy.perf.workload import InputRow

    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    deployment = Deployment.load(make_deployment(max_output_len=8))
    references = ["the fox", "", "triton serves large language models and speech models"]
    warnings: list[str] = []
    rows = lengths_from_references(
        [InputRow(f"q{i}", ref) for i, ref in enumerate(references)], workload, deployment, warnings.append
    )
    counts = [workload.count_text_tokens(ref) for ref in references]
    assert [row.max_tokens for row in rows] == [counts[0], 1, 8] and counts[2] > 8 and 0 < counts[0] <= 8
    assert warnings == [
        "1 of the 3 reference outputs are longer than this deployment's max_output_len 8: their "
        "requests ask for 8 tokens"
    ]
    with pytest.raises(UsageError, match="input row 2 has no reference output to take its output length from"):
        lengths_from_references([InputRow("a", "b"), InputRow("c")], workload, deployment, warnings.append)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"shared_prefixes": 2, "prefix_len": 12}, "--prefix-len 12 leaves no room for a prompt's own tokens"),
        ({"shared_prefixes": 2, "prefix_len": 6, "isl": 7}, "--isl 7 after a --prefix-len 6 is more than this"),
    ],
)
def test_a_shared_prefix_is_held_to_the_deployments_max_input_len(make_deployment, tiny_tokenizer, inputs, message):
    from trtdeploy.benchmark import PerfSettings, apply_limits
    from trtdeploy.deployment import Deployment
    from trtdeploy.perf.llm import TokenLLMWorkload
    from trtdeploy.perf.runner import InputSpec

    deployment = Deployment.load(make_deployment(max_input_len=12))
    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    with pytest.raises(UsageError, match=message):
        apply_limits(PerfSettings(inputs=InputSpec(**inputs)), deployment, workload)
    fitted = apply_limits(PerfSettings(inputs=InputSpec(shared_prefixes=2, prefix_len=5)), deployment, workload)
    assert fitted.inputs.isl == 12 - 5  # the default ISL, within what the prefix leaves
