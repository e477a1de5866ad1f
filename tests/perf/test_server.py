"""The load generator against the real bundled tritonserver serving fake LLMs (tests/perf/models/)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trtdeploy.benchmark import PerfSettings, benchmark
from trtdeploy.deployment import Deployment
from trtdeploy.errors import NotFoundError, ServerError, UsageError
from trtdeploy.perf.llm import TextLLMWorkload, TokenLLMWorkload, load_tokenizer
from trtdeploy.perf.runner import Endpoint, InputSpec, LoadSettings, run_levels
from trtdeploy.perf.slo import Slo
from trtdeploy.perf.workload import InputRow, RequestOptions

ROWS = [InputRow(f"tell me about number {i} please", reference=f"tell me about number {i}") for i in range(6)]


def run(workload, endpoint, load, rows=ROWS, **kwargs):
    return asyncio.run(run_levels(workload, rows, endpoint, load, **kwargs))


def measured(result, level=0):
    return [rec for rec in result.records if rec.level == level and not rec.warmup]


def max_overlap(records) -> int:
    events = sorted([(rec.send_ns, 1) for rec in records] + [(rec.end_ns, -1) for rec in records])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.fixture
def grpc(fake_server) -> Endpoint:
    return Endpoint(fake_server.grpc_url, "grpc", fake_server.metrics_url, fake_server.restricted_headers("grpc"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.server
def test_offline_requests_all_come_back(grpc):
    load = LoadSettings(concurrency=(1, 2), num_requests=len(ROWS), warmup=1)
    result = run(TextLLMWorkload("text_llm"), grpc, load, options=RequestOptions(max_tokens=3))
    assert len(result.records) == 2 * (1 + len(ROWS))
    for index, summary in enumerate(result.summary["levels"]):
        recs = measured(result, index)
        assert sorted(rec.row for rec in recs) == list(range(len(ROWS)))
        assert all(rec.error is None and rec.output_tokens == 3 for rec in recs)
        assert summary["requests"] == len(ROWS) and summary["errors"] == 0
        assert summary["ttft_ms"] is None and summary["e2e_ms"]["count"] == len(ROWS)
        assert summary["server"]["models"]["text_llm"]["requests"] == len(ROWS)
        assert summary["server"]["metrics"]["counters"]  # Prometheus counters moved
    assert result.summary["stream"] is False
    assert result.summary["levels"][0]["accuracy"]["exact_match"] == 0.0  # 3 of the prompt's words only


@pytest.mark.server
def test_streamed_requests_have_ttft_before_e2e(grpc):
    load = LoadSettings(concurrency=(2,), warmup=0)
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, options=RequestOptions(max_tokens=4))
    summary = result.summary["levels"][0]
    for rec in measured(result):
        assert rec.error is None
        assert rec.send_ns < rec.chunk_ns[0] < rec.end_ns
        assert rec.chunk_tokens == [1, 1, 1, 1] and rec.token_source == "server"
        assert rec.text == " ".join(rec.reference.split()[:4])
    assert result.summary["stream"] is True
    assert 5 <= summary["ttft_ms"]["p50"] < summary["e2e_ms"]["p50"]
    assert 4 <= summary["itl_ms"]["p50"] <= 25  # the model sleeps 5 ms per token
    assert summary["accuracy"]["exact_match"] == 0.0 and 0 < summary["accuracy"]["rouge_l_f1"] < 1


@pytest.mark.server
def test_concurrency_four_overlaps_requests(grpc):
    load = LoadSettings(concurrency=(1, 4), num_requests=12, warmup=0)
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, options=RequestOptions(max_tokens=6))
    assert max_overlap(measured(result, 0)) == 1
    assert max_overlap(measured(result, 1)) == 4
    low, high = result.summary["levels"]
    assert high["achieved_concurrency"] > 2.5 > low["achieved_concurrency"]
    assert high["request_throughput"] > 2 * low["request_throughput"]


@pytest.mark.server
@pytest.mark.parametrize("model", ["text_llm", "text_llm_stream"])
def test_failed_requests_are_counted_not_dropped(grpc, model):
    rows = [*ROWS[:3], InputRow("FAIL this one"), InputRow("and FAIL this")]
    load = LoadSettings(concurrency=(2,), num_requests=len(rows), warmup=0)
    result = run(TextLLMWorkload(model), grpc, load, rows=rows, options=RequestOptions(max_tokens=2))
    summary = result.summary["levels"][0]
    assert summary["requests"] == 5 and summary["errors"] == 2 and summary["completed"] == 3
    assert summary["error_rate"] == pytest.approx(0.4)
    failed = [rec for rec in result.records if rec.error]
    assert sorted(rec.row for rec in failed) == [3, 4]
    assert all("fake failure" in rec.error for rec in failed)
    assert list(summary["error_messages"].values()) == [2]


@pytest.mark.server
def test_text_without_ids_is_retokenized(grpc, tiny_tokenizer):
    load = LoadSettings(concurrency=(1,), warmup=0)
    result = run(TextLLMWorkload("text_llm_noids", tiny_tokenizer), grpc, load, options=RequestOptions(max_tokens=5))
    tokenizer = load_tokenizer(tiny_tokenizer)
    assert result.summary["levels"][0]["token_source"] == "retokenized"
    for rec in measured(result):
        assert rec.token_source == "retokenized"
        assert rec.output_tokens == len(tokenizer.encode(rec.text, add_special_tokens=False))
        assert rec.input_tokens == len(tokenizer.encode(ROWS[rec.row].input))


@pytest.mark.server
@pytest.mark.parametrize("model", ["tensorrt_llm", "tensorrt_llm_offline"])
def test_token_contract_counts_generated_ids_only(grpc, tiny_tokenizer, model):
    load = LoadSettings(concurrency=(2,), warmup=0)
    options = RequestOptions(max_tokens=5, ignore_eos=True)
    result = run(TokenLLMWorkload(model, tiny_tokenizer), grpc, load, options=options)
    summary = result.summary["levels"][0]
    assert summary["errors"] == 0
    assert summary["output_tokens"]["min"] == summary["output_tokens"]["max"] == 5  # the echoed prompt is not counted
    assert (summary["itl_ms"] is not None) == (model == "tensorrt_llm")


@pytest.mark.server
def test_http_offline(fake_server):
    endpoint = Endpoint(fake_server.http_url, "http")
    load = LoadSettings(concurrency=(3,), num_requests=len(ROWS), warmup=0)
    result = run(TextLLMWorkload("text_llm"), endpoint, load)
    summary = result.summary["levels"][0]
    assert summary["errors"] == 0 and summary["requests"] == len(ROWS)
    assert result.summary["protocol"] == "http"
    assert summary["server"]["models"]["text_llm"]["requests"] == len(ROWS)


@pytest.mark.server
@pytest.mark.parametrize("model", ["text_llm_tokens", "tensorrt_llm"])
def test_http_streams_llms_through_generate_stream(fake_server, grpc, tiny_tokenizer, model):
    """Over HTTP a decoupled LLM streams through the generate extension: the chunks, tokens and texts of gRPC's."""
    workload = (TextLLMWorkload if model == "text_llm_tokens" else TokenLLMWorkload)(model, tiny_tokenizer)
    rows = [*ROWS[:3], *([InputRow("and FAIL this")] if model == "text_llm_tokens" else [])]
    load = LoadSettings(concurrency=(2,), num_requests=len(rows), warmup=0)
    records = {}
    for endpoint in (grpc, Endpoint(fake_server.http_url, "http")):
        result = run(workload, endpoint, load, rows=rows, options=RequestOptions(max_tokens=4))
        assert result.summary["stream"] is True and result.summary["protocol"] == endpoint.protocol
        records[endpoint.protocol] = {rec.row: rec for rec in measured(result)}
    for row in range(3):
        http, grpc_rec = records["http"][row], records["grpc"][row]
        assert http.error is None and http.send_ns < http.chunk_ns[0] < http.end_ns
        assert http.chunk_tokens == grpc_rec.chunk_tokens == [1, 1, 1, 1] and http.token_source == "server"
        assert http.text == grpc_rec.text and http.text
    if model == "text_llm_tokens":
        assert "fake failure" in records["http"][3].error


@pytest.mark.server
def test_request_rate_levels(grpc):
    load = LoadSettings(request_rates=(40.0, 80.0), num_requests=8)
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, options=RequestOptions(max_tokens=2))
    for summary in result.summary["levels"]:
        assert summary["requests"] == 8 and summary["errors"] == 0
        assert summary["scheduling_lag_ms"]["count"] == 8
    assert [s["request_rate"] for s in result.summary["levels"]] == [40.0, 80.0]


@pytest.mark.server
@pytest.mark.parametrize(("arrival", "burstiness", "workers"), [("constant", 1.0, 1), ("gamma", 0.25, 2)])
def test_requests_go_out_at_the_arrival_process_times(grpc, arrival, burstiness, workers):
    """What was sent keeps the level's rate (within 10%) and the spread of its gaps (their coefficient of variation:
    0 for constant gaps, 2 for gamma gaps of shape 0.25), with the load split over one or two processes."""
    import numpy as np

    from trtdeploy.perf.loadgen import arrival_offsets, arrival_seed

    load = LoadSettings(
        request_rates=(20.0,), num_requests=40, arrival=arrival, burstiness=burstiness, workers=workers, seed=5
    )
    result = run(TextLLMWorkload("text_llm"), grpc, load, options=RequestOptions(max_tokens=1))
    assert result.summary["arrival"] == {"process": arrival, "burstiness": burstiness, "max_concurrency": 0}
    sends = np.sort([rec.send_ns for rec in measured(result)]) / 1e9
    gaps = np.diff(sends)
    seed = arrival_seed(5, 0, warmup=False)
    planned = np.diff(np.array(arrival_offsets(40, 20.0, arrival=arrival, burstiness=burstiness, seed=seed)))
    assert len(sends) == 40 and abs((sends[-1] - sends[0]) / (planned.sum() / 1e9) - 1) < 0.1
    planned_cv = planned.std() / planned.mean()
    assert abs(gaps.std() / gaps.mean() - planned_cv) < 0.15 + 0.1 * planned_cv


@pytest.mark.server
def test_a_capped_open_loop_never_has_more_in_flight(grpc):
    """At 200 requests/s of 50 ms requests about 10 would be in flight; capped at 2, the others wait their turn."""
    load = LoadSettings(request_rates=(200.0,), num_requests=12, arrival="constant", max_concurrency=2)
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, options=RequestOptions(max_tokens=10))
    (level,) = result.summary["levels"]
    assert level["requests"] == 12 and level["errors"] == 0
    assert max_overlap(measured(result)) == 2
    assert level["scheduling_lag_ms"]["max"] > 100  # the last ones waited for about 5 requests' turns


@pytest.mark.server
@pytest.mark.parametrize("workers", [1, 2])
def test_a_closed_loop_for_a_duration_sends_until_the_deadline_and_waits_for_the_rest(grpc, workers):
    """Sends stop at the deadline (1.5 s after the phase starts, which is before the first send); the slots keep
    sending until then, going round the level's 8 rows (the 10 rows but the 2 of the warmup) as often as it
    takes; the requests in flight at the deadline complete. Only recorded times are compared, with the deadline."""
    duration = 1.5
    rows = [InputRow(f"number {i} of ten") for i in range(10)]
    load = LoadSettings(concurrency=(2,), duration_s=duration, workers=workers)
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, rows=rows, options=RequestOptions(max_tokens=4))
    (level,) = result.summary["levels"]
    recs = measured(result)
    first_send = min(rec.send_ns for rec in recs)
    assert (max(rec.send_ns for rec in recs) - first_send) / 1e9 <= duration + 0.1  # nothing sent after it
    assert (max(rec.end_ns for rec in recs) - first_send) / 1e9 >= duration - 0.5  # ...and sent until it
    assert all(rec.error is None and rec.end_ns >= rec.send_ns for rec in recs)  # waited for, not cancelled
    assert level["requests"] == len(recs) == level["completed"] and level["planned_requests"] is None
    assert len({rec.seq for rec in recs}) == len(recs)
    assert level["input_rows_reused"] == max(0, len(recs) - 8)  # every request past the first 8 went round again
    assert level["duration_limit_s"] == duration and level["status"] == "complete"
    assert {rec.row for rec in recs} <= set(range(2, 10))  # rows 0 and 1 were the warmup's


@pytest.mark.server
def test_an_open_loop_for_a_duration_sends_the_arrivals_due_within_it(grpc):
    """20/s with constant gaps for 1 s: the 20 arrivals due at 50, 100, ..., 1000 ms, all sent and answered."""
    load = LoadSettings(request_rates=(20.0,), arrival="constant", duration_s=1.0)
    result = run(TextLLMWorkload("text_llm"), grpc, load, options=RequestOptions(max_tokens=1))
    (level,) = result.summary["levels"]
    recs = measured(result)
    assert level["planned_requests"] == level["requests"] == level["completed"] == 20
    scheduled = sorted(rec.scheduled_ns for rec in recs)
    assert scheduled[-1] - scheduled[0] == 19 * 50_000_000


@pytest.mark.server
def test_a_capped_open_loop_sends_nothing_after_the_deadline(grpc):
    """200/s for 0.5 s is 100 arrivals, but one at a time (each request sleeps 10 x 5 ms in the model) at most
    about 10 fit: those still waiting for the slot at the deadline are not sent."""
    load = LoadSettings(request_rates=(200.0,), arrival="constant", max_concurrency=1, duration_s=0.5)
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, options=RequestOptions(max_tokens=10))
    (level,) = result.summary["levels"]
    recs = measured(result)
    start = min(rec.scheduled_ns for rec in recs) - 5_000_000  # the first arrival is due 5 ms after the start
    assert level["planned_requests"] == 100 and 1 <= level["requests"] == len(recs) <= 11
    assert all(rec.send_ns - start <= 0.5e9 + 0.1e9 for rec in recs)
    assert all(rec.error is None for rec in recs) and max_overlap(recs) == 1


@pytest.mark.server
def test_worker_processes_merge_their_records(grpc):
    load = LoadSettings(concurrency=(4,), num_requests=12, warmup=2, workers=2)
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, options=RequestOptions(max_tokens=3))
    recs = measured(result)
    assert len(recs) == 12 and len(result.records) == 14
    assert {rec.worker for rec in recs} == {0, 1}
    assert sorted(rec.seq for rec in recs) == list(range(2, 14))
    assert max_overlap(recs) >= 3
    assert result.summary["levels"][0]["errors"] == 0


@pytest.mark.server
def test_stream_timeout_fails_the_request(grpc):
    load = LoadSettings(concurrency=(2,), num_requests=2, warmup=0, timeout_s=0.1)
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, options=RequestOptions(max_tokens=40))  # 200 ms
    summary = result.summary["levels"][0]
    assert summary["errors"] == 2 and summary["error_messages"] == {"timed out after 0.1 s": 2}
    assert all(0.1 <= (rec.end_ns - rec.send_ns) / 1e9 < 1.5 for rec in result.records)


@pytest.mark.server
def test_stream_mode_must_match_the_model(grpc, fake_server):
    with pytest.raises(UsageError, match="'text_llm' is not decoupled"):
        run(TextLLMWorkload("text_llm"), grpc, LoadSettings(), stream=True)
    with pytest.raises(UsageError, match="'text_llm_stream' is decoupled"):
        run(TextLLMWorkload("text_llm_stream"), grpc, LoadSettings(), stream=False)
    with pytest.raises(UsageError, match="'text_llm' is not decoupled"):
        run(TextLLMWorkload("text_llm"), Endpoint(fake_server.http_url, "http"), LoadSettings(), stream=True)


@pytest.mark.server
def test_unknown_model_lists_the_served_ones(grpc):
    with pytest.raises(NotFoundError) as caught:
        run(TextLLMWorkload("ensemble"), grpc, LoadSettings())
    assert "has no model 'ensemble'" in caught.value.message and "text_llm_stream" in caught.value.hint


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_unreachable_server_is_a_server_error(protocol):
    port = free_port()
    with pytest.raises(ServerError) as caught:
        run(TextLLMWorkload("ensemble"), Endpoint(f"localhost:{port}", protocol), LoadSettings())
    assert caught.value.message.startswith(f"cannot reach Triton at localhost:{port}: ")
    assert "trtdeploy serve --background" in caught.value.hint


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trtdeploy", "perf", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_cli_unreachable_server_exits_5(make_deployment, tmp_path):
    port = free_port()
    done = _cli(str(make_deployment()), "--url", f"localhost:{port}", "--model", "tensorrt_llm", cwd=tmp_path)
    assert done.returncode == 5, done.stderr
    assert f"Error: cannot reach Triton at localhost:{port}:" in done.stderr
    assert done.stdout == ""


@pytest.mark.server
def test_cli_json_run_writes_reports(fake_server, make_deployment, tmp_path):
    out = tmp_path / "out"
    done = _cli(
        str(make_deployment()),
        *("--url", fake_server.grpc_url, "--metrics-url", fake_server.metrics_url, "--model", "tensorrt_llm"),
        *("--isl", "8", "--osl", "4", "--ignore-eos", "-c", "1,2", "--slo", "ttft_ms=1000,itl_ms=1000"),
        *("--output-dir", str(out), "--json"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # stdout holds the JSON and nothing else
    assert [level["concurrency"] for level in summary["levels"]] == [1, 2]
    assert summary["levels"][0]["input_tokens"]["min"] == summary["levels"][0]["input_tokens"]["max"] == 8
    assert summary["levels"][1]["output_tokens"]["p50"] == 4
    assert summary["levels"][1]["goodput"] == pytest.approx(summary["levels"][1]["request_throughput"])
    assert sorted(p.name for p in out.iterdir()) == [
        "latency.png",
        "requests.jsonl",
        "summary.csv",
        "summary.json",
        "throughput.png",
    ]
    assert json.loads((out / "summary.json").read_text()) == summary


@pytest.mark.server
def test_benchmark_finds_the_server_serve_started(make_deployment, tmp_path, monkeypatch):
    from trtdeploy.server import serve_deployment

    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)  # a bare run loads the server of the deployment under the current folder
    deployment = Deployment.load(make_deployment(models=["tensorrt_llm"]))
    server, _ = serve_deployment(deployment, background=True)
    with server:
        settings = PerfSettings(
            model="tensorrt_llm",
            inputs=InputSpec(isl=8, osl=3),
            load=LoadSettings(num_requests=4, warmup=0),
            output_dir=tmp_path / "out",
            plots=False,
        )
        result = benchmark(settings)
    assert result.summary["url"] == server.grpc_url
    assert result.summary["deployment"] == str(deployment.path)
    level = result.summary["levels"][0]
    assert level["requests"] == 4 and level["errors"] == 0 and level["output_tokens"]["mean"] == 3
    assert level["server"]["metrics"] is not None  # the recorded server's metrics port
    assert (tmp_path / "out" / "summary.json").is_file()


@pytest.mark.server
def test_cli_plugin_workload_and_error_rate_exit(fake_server, fake_plugin, make_deployment, tmp_path, capsys):
    from trtdeploy.cli.main import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input": text}) + "\n" for text in ("one two", "FAIL now", "three")))
    out = tmp_path / "out"
    args = ["perf", str(make_deployment()), "--url", fake_server.grpc_url, "--input-data", str(prompts)]
    args += ["--model", "text_llm", "--osl", "2", "--num-requests", "3", "--output-dir", str(out), "--no-plots"]
    with pytest.raises(SystemExit) as caught:
        main(args)
    captured = capsys.readouterr()
    assert caught.value.code == 6, captured.err
    assert "1 of 3 requests failed at concurrency 1" in " ".join(captured.err.split())
    assert "text_llm (offline, grpc)" in captured.out
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert [line["row"] for line in lines if line["error"]] == [1]
    assert [line["warmup"] for line in lines] == [True, False, False, False]

    with pytest.raises(SystemExit) as caught:
        main([*args, "--max-error-rate", "0.5"])
    assert caught.value.code == 0


@pytest.mark.server
def test_cli_find_searches_levels_and_keeps_each_on_disk(fake_server, fake_plugin, make_deployment, tmp_path, capsys):
    """The offline fake answers one request at a time, each after sleeping 200 x 1 ms. At concurrency 1 a request
    takes 200 ms and some overhead; at 2, in closed loop, every request but the first waits for the other slot's
    whole request before its own: at least 400 ms (sleeps only ever last longer). So e2e_ms<=380 holds at 1 (75%
    of the requests within 180 ms of overhead are enough) and cannot hold at 2: the search runs 1, then 2, and
    finds 1."""
    from trtdeploy.cli.main import main

    out = tmp_path / "out"
    deployment = make_deployment(max_output_len=256)
    args = ["perf", str(deployment), "--url", fake_server.grpc_url, "--model", "text_llm", "--isl", "8"]
    args += ["--osl", "200", "--find", "max-concurrency", "--slo", "e2e_ms<=380", "--attainment", "0.75"]
    with pytest.raises(SystemExit) as caught:
        main([*args, "--output-dir", str(out), "--no-plots"])
    captured = capsys.readouterr()
    assert caught.value.code == 0, captured.err
    printed = " ".join(captured.out.split())
    assert "max concurrency meeting e2e_ms<=380 for 75% of requests: 1 (attainment" in printed
    assert "2 missed it; 2 levels run)" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["find"] == "max-concurrency" and summary["slo"] == {"limits": {"e2e_ms": 380}, "attainment": 0.75}
    assert summary["search"] == {
        "find": "max-concurrency",
        "start": 1,
        "found": 1,
        "level": 0,
        "lowest_failed": 2,
        "ceiling_reached": False,
        "levels_run": 2,
    }
    assert [(level["concurrency"], level["slo_met"]) for level in summary["levels"]] == [(1, True), (2, False)]
    assert summary["levels"][1]["attainment"] <= 1 / 16  # only the first request at 2 had nobody ahead of it
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {record["level"] for record in records} == {0, 1} and len(records) == (1 + 16) + (2 + 16)

    with pytest.raises(SystemExit) as caught:
        main([*args[:-6], "--find", "max-concurrency"])  # no --slo
    assert caught.value.code == 2
    assert "--find max-concurrency looks for the highest level that meets --slo" in capsys.readouterr().err


@pytest.mark.server
@pytest.mark.parametrize("model", ["text_llm", "text_llm_stream"])
def test_zero_token_answers_are_successes(grpc, model):
    """A model whose first token is end-of-sequence: a success with 0 tokens, no TTFT, no ttft/itl SLO met."""
    rows = [InputRow(ROWS[0].input), InputRow("an EMPTY answer", reference="")]
    stream = model == "text_llm_stream"
    slo = Slo.parse("ttft_ms<=10000,itl_ms<=10000" if stream else "e2e_ms<=10000")
    load = LoadSettings(concurrency=(1,), num_requests=2, warmup=0)
    result = run(TextLLMWorkload(model), grpc, load, rows=rows, options=RequestOptions(max_tokens=3), slo=slo)
    summary = result.summary["levels"][0]
    assert summary["errors"] == 0 and summary["completed"] == 2, summary["error_messages"]
    empty = next(rec for rec in result.records if rec.row == 1)
    assert (empty.output_tokens, empty.token_source, empty.text, empty.chunk_ns) == (0, "server", "", [])
    assert summary["zero_output_requests"] == 1
    assert summary["output_token_throughput"] == pytest.approx(3 / summary["duration_s"])
    assert summary["output_tokens"]["min"] == 0 and summary["accuracy"]["exact_match"] == 1.0
    if stream:
        assert summary["ttft_ms"]["count"] == 1
        assert summary["goodput"] == pytest.approx(1 / summary["duration_s"])  # the empty answer meets no TTFT
    else:
        assert summary["goodput"] == pytest.approx(2 / summary["duration_s"])


@pytest.mark.server
@pytest.mark.parametrize("model", ["tensorrt_llm", "tensorrt_llm_offline", "tensorrt_llm_exclude"])
def test_generated_ids_equal_to_the_prompt_are_counted(grpc, tiny_tokenizer, model):
    """The fake repeats the prompt "!": the prompt is dropped by its length, only where the model echoes it."""
    load = LoadSettings(concurrency=(1,), num_requests=2, warmup=0)
    options = RequestOptions(max_tokens=4, ignore_eos=True)
    result = run(TokenLLMWorkload(model, tiny_tokenizer), grpc, load, rows=[InputRow("!")], options=options)
    assert [rec.output_tokens for rec in result.records] == [4, 4]


@pytest.mark.server
def test_streamed_text_is_decoded_from_all_its_ids(grpc, tiny_tokenizer):
    """The server decodes each streamed token alone, so "好" (three byte tokens) streams as U+FFFD pieces;
    the text scored (and recorded) is the ids decoded at once."""
    tokenizer = load_tokenizer(tiny_tokenizer)
    prompt = "好 ok"
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert len(tokenizer.encode("好", add_special_tokens=False)) == 3
    load = LoadSettings(concurrency=(1,), num_requests=1, warmup=0)
    options = RequestOptions(max_tokens=len(ids))
    rows = [InputRow(prompt, reference=prompt)]
    result = run(TextLLMWorkload("text_llm_tokens", tiny_tokenizer), grpc, load, rows=rows, options=options)
    (rec,) = result.records
    assert rec.error is None and rec.chunk_tokens == [1] * len(ids)
    assert rec.text == prompt
    assert result.summary["levels"][0]["accuracy"]["exact_match"] == 1.0
    pieces = run(TextLLMWorkload("text_llm_tokens"), grpc, load, rows=rows, options=options)  # no tokenizer
    assert "\ufffd" in pieces.records[0].text  # what the chunks' texts give


def token_contract_run(fake_server, deployment, tmp_path, **settings):
    """``benchmark`` of the fake server's token-contract model loaded as ``deployment`` (no plots)."""
    return benchmark(
        PerfSettings(
            deployment=deployment,
            url=fake_server.grpc_url,
            model="tensorrt_llm",
            output_dir=tmp_path / "out",
            plots=False,
            **settings,
        )
    )


@pytest.mark.server
def test_defaults_follow_the_deployment_limits(fake_server, make_deployment, tmp_path):
    deployment = make_deployment(max_input_len=12, max_output_len=5)
    result = token_contract_run(fake_server, deployment, tmp_path, load=LoadSettings(num_requests=2, warmup=0))
    level = result.summary["levels"][0]
    assert level["errors"] == 0
    assert level["input_tokens"]["min"] == level["input_tokens"]["max"] == 12  # min(128, max_input_len)
    assert level["output_tokens"]["min"] == level["output_tokens"]["max"] == 5  # min(128, max_output_len)
    assert result.summary["options"]["max_tokens"] == 5 and result.summary["input"] == "synthetic isl=12"


@pytest.mark.server
def test_drawn_lengths_reach_the_server_within_the_deployment_limits(fake_server, make_deployment, tmp_path):
    result = token_contract_run(
        fake_server,
        make_deployment(max_input_len=24, max_output_len=8),
        tmp_path,
        load=LoadSettings(concurrency=(4,), num_requests=40, warmup=0),
        inputs=InputSpec(isl=16, osl=5, isl_stddev=6, osl_stddev=3),
        options=RequestOptions(ignore_eos=True),
    )
    level = result.summary["levels"][0]
    assert level["errors"] == 0 and result.summary["input"] == "synthetic isl=16±6, osl=5±3"
    assert 1 <= level["input_tokens"]["min"] < 16 < level["input_tokens"]["max"] <= 24
    assert 1 <= level["output_tokens"]["min"] < 5 < level["output_tokens"]["max"] <= 8


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--osl", "6"], "--osl 6 is more than this deployment's max_output_len 5"),
        (["--isl", "13"], "--isl 13 is more than this deployment's max_input_len 12"),
        (["--input-data", "ROWS"], "input row 2 asks for max_tokens 9, more than this deployment's max_output_len 5"),
    ],
)
def test_lengths_beyond_the_deployment_limits_are_refused(make_deployment, tmp_path, args, message):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"input": "a", "max_tokens": 5}\n{"input": "b", "max_tokens": 9}\n')
    args = [str(rows) if arg == "ROWS" else arg for arg in args]
    deployment = make_deployment(max_input_len=12, max_output_len=5)
    done = _cli(str(deployment), "--url", f"localhost:{free_port()}", "--model", "tensorrt_llm", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in " ".join(done.stderr.split()) and "Error:" in done.stderr
    assert not (tmp_path / "perf-results").exists()  # nothing left behind


def test_an_slo_key_the_workload_does_not_measure_is_refused_before_the_server(make_deployment, tmp_path):
    done = _cli(
        str(make_deployment()),
        *("--url", f"localhost:{free_port()}", "--model", "tensorrt_llm", "--slo", "ttft_ms<=100,rtf_p95<=1"),
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr  # a usage error, before the (unreachable) server is tried
    message = " ".join(done.stderr.split())
    assert "Error: --slo rtf_p95 cannot be measured for llm requests" in message
    assert "SLO keys here: ttft_ms, itl_ms, e2e_ms" in message and done.stderr.count("Error:") == 1


@pytest.mark.parametrize("where", ["/proc/trtdeploy-perf", "FILE", "FILE/below"])
def test_an_unusable_output_dir_is_refused_before_the_load(make_deployment, tmp_path, where):
    (tmp_path / "file").write_text("not a folder")
    out = where.replace("FILE", str(tmp_path / "file"))
    done = _cli(
        str(make_deployment()),
        *("--url", f"localhost:{free_port()}", "--model", "tensorrt_llm", "--output-dir", out),
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr  # a usage error, before the (unreachable) server is tried
    assert f"Error: cannot write reports to {out}:" in done.stderr and "--output-dir" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_failed_run_leaves_no_empty_reports_folder(make_deployment, tmp_path):
    done = _cli(str(make_deployment()), "--url", f"localhost:{free_port()}", "--model", "tensorrt_llm", cwd=tmp_path)
    assert done.returncode == 5, done.stderr
    assert not (tmp_path / "perf-results").exists()


@pytest.mark.server
def test_cli_without_matplotlib_keeps_the_results(fake_server, make_deployment, tmp_path, capsys, monkeypatch):
    from trtdeploy.cli.main import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "out"
    args = ["perf", str(make_deployment()), "--url", fake_server.grpc_url, "--model", "tensorrt_llm"]
    with pytest.raises(SystemExit) as caught:
        main([*args, "--isl", "4", "--osl", "2", "--num-requests", "2", "--output-dir", str(out)])
    captured = capsys.readouterr()
    assert caught.value.code == 0, captured.err
    assert "Warning: plots skipped: matplotlib cannot be imported" in " ".join(captured.err.split())
    assert "tensorrt_llm (streaming, grpc)" in captured.out and f"reports: {out}" in captured.out
    assert sorted(p.name for p in out.iterdir()) == ["requests.jsonl", "summary.csv", "summary.json"]


@pytest.mark.server
def test_a_deployment_is_loaded_on_the_server_that_serves_it(make_deployment, tmp_path, monkeypatch):
    """Two servers: `perf DEPLOYMENT` goes to the one serving DEPLOYMENT, not to the latest one."""
    from trtdeploy.server import serve_deployment

    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(tmp_path / "state"))
    first, second = (Deployment.load(make_deployment(model=name, models=["tensorrt_llm"])) for name in ("a", "b"))
    unserved = make_deployment(model="c")
    settings = PerfSettings(
        model="tensorrt_llm",
        inputs=InputSpec(isl=4, osl=2),
        load=LoadSettings(num_requests=1, warmup=0),
        plots=False,
    )
    server_a, _ = serve_deployment(first, background=True)
    with server_a:
        server_b, _ = serve_deployment(second, background=True)  # started last
        with server_b:
            for deployment, server in ((first, server_a), (second, server_b)):
                chosen = replace(settings, deployment=deployment.path, output_dir=tmp_path / deployment.path.name)
                result = benchmark(chosen)
                assert result.summary["url"] == server.grpc_url
                assert result.summary["deployment"] == str(deployment.path)
            with pytest.raises(ServerError) as caught:
                benchmark(replace(settings, deployment=unserved, output_dir=tmp_path / "c"))
            # --url wins over the deployment's server, with a warning that they differ
            warnings: list[str] = []
            chosen = replace(settings, deployment=first.path, url=server_b.grpc_url, output_dir=tmp_path / "url")
            assert benchmark(chosen, warn=warnings.append).summary["url"] == server_b.grpc_url
            assert warnings == [
                f"the server at {server_b.grpc_url} serves {second.path}, not {first.path}; loading it as the latter"
            ]
    assert caught.value.message == f"no running server serves {unserved.resolve()}"
    assert f"trtdeploy serve {unserved.resolve()} --background" in caught.value.hint
    assert "--url" in caught.value.hint and server_b.grpc_url in caught.value.hint
    assert not (tmp_path / "c").exists()


@pytest.mark.server
def test_server_statistics_that_cannot_be_read_cost_no_results(tmp_path):
    """Statistics and metrics are extras: a server that refuses them (here: statistics restricted, metrics on a
    closed port) still gets every result measured, with the reason in the level's server section."""
    from trtdeploy.server import launch

    from .conftest import write_fake_repo

    repo = write_fake_repo(tmp_path / "repo", ["text_llm"])
    refuse = [f"--{api}=statistics:stats-key=secret" for api in ("grpc-restricted-protocol", "http-restricted-api")]
    with launch(repo, extra_args=refuse, log_file=tmp_path / "log", timeout=60) as server:
        endpoint = Endpoint(server.grpc_url, "grpc", f"http://127.0.0.1:{free_port()}/metrics")
        load = LoadSettings(concurrency=(2,), num_requests=4, warmup=0)
        result = run(TextLLMWorkload("text_llm"), endpoint, load, options=RequestOptions(max_tokens=2))
    level = result.summary["levels"][0]
    assert level["status"] == "complete" and level["completed"] == 4 and level["e2e_ms"]["count"] == 4
    assert level["server"]["models"] == {} and "restricted" in level["server"]["unavailable"]


@pytest.mark.server
def test_gauges_are_sampled_while_the_level_runs(grpc):
    """Prometheus gauges (pending requests, KV-cache use, CPU) are scraped about every second during the level,
    not read after it has drained: each comes as min/mean/max over its samples."""
    load = LoadSettings(concurrency=(4,), num_requests=24, warmup=0)  # 6 rounds of 40 tokens x 5 ms: ~1.2 s
    result = run(TextLLMWorkload("text_llm_stream"), grpc, load, options=RequestOptions(max_tokens=40))
    level = result.summary["levels"][0]
    gauges = level["server"]["metrics"]["gauges"]
    cpu = gauges["nv_cpu_utilization"]
    assert 1 <= cpu["samples"] <= level["duration_s"] + 1
    assert cpu["min"] <= cpu["mean"] <= cpu["max"]
    assert any(series.startswith('nv_inference_pending_request_count{model="text_llm_stream"') for series in gauges)
