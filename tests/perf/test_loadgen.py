"""Level plans, splitting across workers, settings validation and command-line parsing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from trtdeploy.errors import UsageError
from trtdeploy.perf.loadgen import Level, arrival_offsets, arrival_seed, arrivals_within
from trtdeploy.perf.runner import InputSpec, LoadSettings
from trtdeploy.perf.workload import RequestOptions


def test_level_items_number_warmup_then_measured_requests():
    level = Level(0, rows=(3, 4, 5), warmup_rows=(1, 2), concurrency=2)
    assert level.items(warmup=True) == [(0, 1, True), (1, 2, True)]
    assert level.items(warmup=False) == [(2, 3, False), (3, 4, False), (4, 5, False)]
    assert (level.warmup, level.num_requests) == (2, 3)


def test_closed_loop_shares_split_slots_and_requests_alike():
    level = Level(0, rows=tuple(range(10)), concurrency=5)
    shares = level.shares(2, seed=0, warmup=False)
    assert [share.slots for share in shares] == [3, 2]
    assert [len(share.items) for share in shares] == [6, 4]
    assert sorted(seq for share in shares for seq, _, _ in share.items) == list(range(10))
    # fewer slots than workers: the idle worker gets nothing
    idle = Level(0, rows=tuple(range(4)), concurrency=1).shares(2, seed=0, warmup=False)
    assert [len(share.items) for share in idle] == [4, 0]


def test_open_loop_shares_split_one_arrival_process():
    level = Level(0, rows=tuple(range(9)), request_rate=30.0, arrival="gamma", burstiness=0.5)
    shares = level.shares(3, seed=1, warmup=False)
    assert [len(share.items) for share in shares] == [3, 3, 3]
    merged = sorted(
        (offset, seq) for share in shares for (seq, _, _), offset in zip(share.items, share.offsets_ns, strict=True)
    )
    (alone,) = level.shares(1, seed=1, warmup=False)
    assert merged == sorted(zip(alone.offsets_ns, (seq for seq, _, _ in alone.items), strict=True))
    seed = arrival_seed(1, 0, warmup=False)
    assert alone.offsets_ns == tuple(arrival_offsets(9, 30.0, arrival="gamma", burstiness=0.5, seed=seed))
    assert level.shares(1, seed=1, warmup=True)[0].offsets_ns == ()  # no warmup requests
    assert [share.cap for share in shares] == [0, 0, 0]


def test_a_capped_open_loop_gives_each_process_requests_in_proportion_to_its_slots():
    level = Level(0, rows=tuple(range(9)), request_rate=30.0, max_concurrency=5)
    capped = level.shares(3, seed=1, warmup=False)
    assert [share.cap for share in capped] == [2, 2, 1] and [len(share.items) for share in capped] == [4, 3, 2]
    (alone,) = level.shares(1, seed=1, warmup=False)
    merged = sorted(offset for share in capped for offset in share.offsets_ns)
    assert merged == sorted(alone.offsets_ns) and alone.cap == 5


@pytest.mark.parametrize(
    ("arrival", "burstiness", "cv"),
    [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5), ("constant", 1.0, 0.0)],
)
def test_arrival_processes_keep_the_rate_and_their_spread(arrival, burstiness, cv):
    offsets = np.array(arrival_offsets(20000, 50.0, arrival=arrival, burstiness=burstiness, seed=(3,)))
    gaps = np.diff(np.concatenate([[0], offsets])) / 1e9
    assert abs(1 / gaps.mean() - 50.0) < 0.05 * 50.0
    assert abs(gaps.std() / gaps.mean() - cv) < 0.05 * max(cv, 0.1)


def test_a_closed_loop_for_a_duration_goes_round_its_requests_with_fresh_sequence_numbers():
    from trtdeploy.perf.loadgen import _rounds

    level = Level(0, rows=(4, 5, 6), warmup_rows=(3,), concurrency=2, duration_s=1.5)
    shares = level.shares(2, seed=0, warmup=False)
    assert [(share.duration_ns, share.cycle) for share in shares] == [(1_500_000_000, 3)] * 2
    assert level.shares(1, seed=0, warmup=True)[0].duration_ns is None  # the warmup is a count
    first = list(itertools.islice(_rounds(shares[0].items, shares[0].cycle), 6))
    second = list(itertools.islice(_rounds(shares[1].items, shares[1].cycle), 3))
    assert first == [(1, 4, False), (3, 6, False), (4, 4, False), (6, 6, False), (7, 4, False), (9, 6, False)]
    assert second == [(2, 5, False), (5, 5, False), (8, 5, False)]  # no sequence number taken twice
    assert level.planned is None and Level(0, rows=(1, 2), request_rate=5.0, duration_s=1.0).planned == 2


@pytest.mark.parametrize(("arrival", "burstiness"), [("poisson", 1.0), ("gamma", 0.5), ("constant", 1.0)])
def test_an_open_loop_for_a_duration_sends_the_arrivals_due_within_it(arrival, burstiness):
    seed = arrival_seed(2, 1, warmup=False)
    count = arrivals_within(3.0, 40.0, arrival=arrival, burstiness=burstiness, seed=seed)
    offsets = arrival_offsets(count + 1, 40.0, arrival=arrival, burstiness=burstiness, seed=seed)
    assert offsets[count - 1] <= 3e9 < offsets[count]  # the first arrival after the duration is left out
    load = LoadSettings(request_rates=(10.0, 40.0), arrival=arrival, burstiness=burstiness, duration_s=3.0, seed=2)
    assert load.levels(rows=None)[1].num_requests == count
    assert arrivals_within(1.0, 20.0, arrival="constant") == 20  # due at 50, 100, ..., 1000 ms


def _plan(levels):
    return [(lv.concurrency or lv.request_rate, lv.warmup_rows, lv.rows, lv.reused_rows) for lv in levels]


def test_every_request_takes_a_fresh_row():
    """Warmup and measured rows come in order across the whole run: no request repeats an earlier prompt."""
    levels = LoadSettings(concurrency=(1, 2), num_requests=3).levels(rows=20)
    assert _plan(levels) == [(1, (0,), (1, 2, 3), 0), (2, (4, 5), (6, 7, 8), 0)]


def test_default_requests_divide_the_rows_among_the_levels():
    # 100 rows, warmups 1 + 8: 91 left, 45 per level (at least 4 x concurrency)
    levels = LoadSettings(concurrency=(1, 8)).levels(rows=100)
    assert [(lv.warmup, lv.num_requests, lv.reused_rows) for lv in levels] == [(1, 45, 0), (8, 45, 0)]
    assert sorted(row for lv in levels for row in lv.warmup_rows + lv.rows) == list(range(99))
    rates = LoadSettings(request_rates=(2.0, 5.5)).levels(rows=10)
    assert [(lv.request_rate, lv.num_requests, lv.warmup) for lv in rates] == [(2.0, 20, 0), (5.5, 55, 0)]


def test_too_few_rows_are_reused_and_counted():
    levels = LoadSettings(concurrency=(2,), num_requests=6, warmup=2).levels(rows=5)
    (level,) = levels
    assert level.warmup_rows == (0, 1) and level.rows == (2, 3, 4, 0, 1, 2)
    assert level.reused_rows == 3  # rows 0 and 1 (sent as warmup) and 2 (sent earlier in the level)


def test_reuse_rows_replays_the_same_rows_on_purpose():
    levels = LoadSettings(concurrency=(1, 2), num_requests=3, reuse_rows=True).levels(rows=20)
    assert _plan(levels) == [(1, (0,), (0, 1, 2), 1), (2, (0, 1), (0, 1, 2), 3)]
    assert LoadSettings(concurrency=(4,), reuse_rows=True).levels(rows=10)[0].num_requests == 16  # max(16, rows)


def test_synthetic_inputs_give_every_request_its_own_prompt():
    levels = LoadSettings(concurrency=(1, 8)).levels(rows=None)
    assert [(lv.num_requests, lv.warmup, lv.reused_rows) for lv in levels] == [(16, 1, 0), (32, 8, 0)]
    rows = [row for lv in levels for row in lv.warmup_rows + lv.rows]
    assert rows == list(range(16 + 1 + 32 + 8))  # made in this order, a level at a time
    repeat = LoadSettings(concurrency=(1, 8), reuse_rows=True).levels(rows=None)
    assert max(row for lv in repeat for row in lv.warmup_rows + lv.rows) == 31  # every level from row 0
    assert [lv.reused_rows for lv in repeat] == [1, 16]  # rows 0..15 were sent before


def test_levels_planned_one_at_a_time_are_the_levels_planned_at_once():
    from trtdeploy.perf.runner import LevelPlan

    load = LoadSettings(concurrency=(1, 4, 2), num_requests=5)
    plan = LevelPlan(load, rows=12)
    assert [plan.level(value) for value in load.values] == load.levels(rows=12)
    rates = LoadSettings(request_rates=(2.0, 0.5))
    plan = LevelPlan(rates, rows=None)
    first = plan.level(2.0)
    assert (first.index, first.request_rate, first.rows) == (0, 2.0, tuple(range(20)))
    second = plan.level(0.5)  # 5 s of arrivals, at least SYNTHETIC_MIN requests
    assert (second.index, second.rows) == (1, tuple(range(20, 36)))


@pytest.mark.parametrize(
    "kwargs",
    [{"workers": 0}, {"request_rates": (0.0,)}, {"num_requests": 0}, {"warmup": -1}, {"timeout_s": 0}],
)
def test_bad_load_settings(kwargs):
    with pytest.raises(UsageError):
        LoadSettings(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arrival": "uniform", "request_rates": (5.0,)}, "--arrival 'uniform' is not one of poisson, gamma, constant"),
        ({"arrival": "gamma"}, "--arrival gamma spaces open-loop requests"),
        ({"arrival": "gamma", "request_rates": (5.0,), "burstiness": 0.0}, "--burstiness must be > 0"),
        ({"request_rates": (5.0,), "burstiness": 2.0}, "--burstiness is the shape of gamma arrivals"),
        ({"max_concurrency": 4}, "--max-concurrency caps open-loop levels"),
        ({"request_rates": (5.0,), "max_concurrency": 2, "workers": 3}, "--max-concurrency 2 is less than --workers 3"),
        ({"request_rates": (5.0,), "max_concurrency": -1}, "--max-concurrency must be >= 0"),
        ({"duration_s": 0.0}, "--duration must be > 0 seconds, got 0"),
        ({"duration_s": 5.0, "num_requests": 10}, "--duration and --num-requests are exclusive"),
    ],
)
def test_arrival_settings_are_checked(kwargs, message):
    with pytest.raises(UsageError, match=message):
        LoadSettings(**kwargs)
    levels = LoadSettings(request_rates=(5.0,), arrival="gamma", burstiness=0.5, num_requests=3).levels(rows=3)
    assert (levels[0].arrival, levels[0].burstiness) == ("gamma", 0.5)


def test_inputs_are_exclusive(tmp_path):
    with pytest.raises(UsageError, match="--input-data and --isl are exclusive"):
        InputSpec(input_data=tmp_path / "a.jsonl", isl=5)
    with pytest.raises(UsageError, match="go with --dataset"):
        InputSpec(column="text")


def test_endpoint_from_url(tmp_path, monkeypatch):
    from trtdeploy.benchmark import resolve_endpoint

    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(tmp_path))  # no server recorded
    endpoint, deployment = resolve_endpoint("grpc://localhost:8001/", "grpc", None)
    assert endpoint.url == "localhost:8001" and deployment is None
    assert endpoint.metrics_url == "http://localhost:8002/metrics"
    assert resolve_endpoint("localhost:20001", "http", None)[0].metrics_url is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "0"], "--concurrency values must be >= 1, got 0"),
        (["-c", "1,x"], "--concurrency: 'x' in '1,x' is not an integer"),
        (["-c", "1", "--request-rate", "5"], "--concurrency and --request-rate are exclusive"),
        (["--request-rate", "5,-1"], "--request-rate values must be > 0, got -1"),
        (["--request-rate", "5,x"], "--request-rate: 'x' in '5,x' is not a number"),
        (["--request-rate", "inf"], "--request-rate values must be > 0, got inf"),
        (["--slo", "ttft_ms"], "--slo: 'ttft_ms' is not KEY<=LIMIT"),
        (["--slo", "ttft_ms<=fast"], "--slo ttft_ms<=fast: the limit must be a number"),
        (["--slo", "ttft_ms<=0"], "--slo ttft_ms<=0: a limit must be > 0"),
        (["--slo", "latency<=5"], "--slo latency<=5: unknown key 'latency'"),
        (["--slo", "ttft_ms<=5", "--attainment", "95"], "--attainment must be > 0 and <= 1"),
        (["--attainment", "0.9"], "--attainment is the share of requests that must meet --slo"),
        (["--duration", "5", "--num-requests", "3"], "--duration and --num-requests are exclusive"),
        (["--duration", "-1"], "--duration must be > 0 seconds, got -1"),
        (["--max-error-rate", "2"], "--max-error-rate must be between 0 and 1"),
        (["--temperature", "-0.5"], "--temperature must be >= 0 (0: greedy), got -0.5"),
        (["--top-p", "0"], "--top-p must be > 0 and <= 1, got 0"),
        (["--top-p", "1.5"], "--top-p must be > 0 and <= 1, got 1.5"),
        (["--top-k", "-1"], "--top-k must be >= 0 (0: off), got -1"),
        (["--url", "notaport:xx"], "--url 'notaport:xx' is not HOST:PORT"),
        (["--url", "localhost"], "--url 'localhost' is not HOST:PORT"),
        (["--url", "localhost:0"], "port 0 is not between 1 and 65535"),
    ],
)
def test_cli_usage_errors_are_one_line_errors(args, message, capsys, tmp_path, monkeypatch):
    """Bad values are the project's `Error: ...` (exit 2), naming the option, before any server is looked for."""
    from trtdeploy.cli.main import main

    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(tmp_path))  # no server recorded
    monkeypatch.chdir(tmp_path)  # no deployment
    with pytest.raises(SystemExit) as caught:
        main(["perf", *args])
    err = capsys.readouterr().err
    assert caught.value.code == 2, err
    assert err.startswith("Error: ") and err.count("Error:") == 1
    assert message in " ".join(err.split())
    assert "Usage:" not in err and "╭" not in err  # not click's boxed usage error


def test_option_lists_raise_usage_errors():
    from trtdeploy.cli._options import parse_int_list, parse_key_values

    assert parse_int_list(" 1, 2,4", name="--concurrency") == [1, 2, 4]
    with pytest.raises(UsageError, match="--concurrency: '' in '1,,2' is not an integer") as caught:
        parse_int_list("1,,2", name="--concurrency")
    assert caught.value.hint == "pass comma-separated integers, e.g. --concurrency 1,2,4"
    assert parse_key_values(["a = 1", "b=x=y"], name="--option") == {"a": "1", "b": "x=y"}
    with pytest.raises(UsageError, match="--option expects key=value, got '=1'"):
        parse_key_values(["=1"], name="--option")


def test_sampling_options():
    assert RequestOptions(temperature=0.7).top_p == 1.0  # TRT-LLM would decode greedily with top_k = top_p = 0
    assert RequestOptions(temperature=0.7, top_k=0).top_p == 1.0  # top-k 0 is off
    assert RequestOptions(temperature=0.7, top_k=5).top_p is None
    assert RequestOptions(temperature=0.7, top_p=0.9).top_p == 0.9
    assert RequestOptions(temperature=0.0).top_p is None  # greedy
    assert RequestOptions().top_p is None
    with pytest.raises(UsageError, match="--temperature must be >= 0"):
        RequestOptions(temperature=float("nan"))


def test_a_bare_perf_refuses_to_guess_between_servers(tmp_path, monkeypatch, capsys):
    """Two servers run for deployments under the current folder: a bare `perf` names both and picks neither."""
    import json
    import os

    from trtdeploy.cli.main import main
    from trtdeploy.server import ServerInfo
    from trtdeploy.server._process import process_start_ticks

    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    records = tmp_path / "state" / "servers"
    records.mkdir(parents=True)
    for port, name in ((9001, "a"), (9101, "b")):  # records of a live process (this one) serving a and b
        info = ServerInfo(
            grpc_port=port, http_port=port + 1, pid=os.getpid(), pgid=os.getpid(),
            start_ticks=process_start_ticks(os.getpid()), deployment=tmp_path / "deployments" / name,
        )  # fmt: skip
        (records / f"{port}-{os.getpid()}.json").write_text(json.dumps(info.to_dict(secrets=True)))
    with pytest.raises(SystemExit) as caught:
        main(["perf"])
    err = " ".join(capsys.readouterr().err.split())
    assert caught.value.code == 2, err
    assert f"Error: 2 servers run for deployments under {tmp_path}" in err
    assert "127.0.0.1:9001" in err and "127.0.0.1:9101" in err and "--url" in err


class _Health:
    """Stands in for the control client's liveness probe: live or failing, as the test says."""

    url = "127.0.0.1:1"

    def __init__(self) -> None:
        self.live = True

    async def is_live(self) -> bool:
        if not self.live:
            raise ConnectionRefusedError("refused")
        return True


class _Driver:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, message: str) -> None:
        self.aborted.append(message)


@pytest.mark.parametrize("requests_succeed", [True, False])
def test_the_server_is_lost_when_probes_fail_and_no_request_succeeds(monkeypatch, requests_succeed):
    """A failing health endpoint alone does not end a level whose requests still succeed."""
    import asyncio

    from trtdeploy.perf import runner

    monkeypatch.setattr(runner, "PROBE_INTERVAL_S", 0.01)
    monkeypatch.setattr(runner, "PROBE_GAP_S", 0.01)
    health, driver = _Health(), _Driver()
    watch = runner.ServerWatch(health)

    async def phase() -> runner.PhaseResult:
        await asyncio.sleep(0.05)
        health.live = False
        for done in range(1, 30):
            watch.progress(done, 0 if requests_succeed else done)  # (requests complete, of them failed)
            await asyncio.sleep(0.01)
        return runner.PhaseResult([0.0])

    async def scenario() -> None:
        await watch.guard(driver, phase())

    if requests_succeed:
        asyncio.run(scenario())
        assert driver.aborted == []
    else:
        with pytest.raises(runner.ServerLost, match="stopped answering: refused"):
            asyncio.run(scenario())
        assert driver.aborted == ["server lost: refused"]
