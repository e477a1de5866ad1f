"""Trace replay: reading Mooncake-format traces, their prompts' shared blocks and lengths, their schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtdeploy.errors import NotFoundError, UsageError
from trtdeploy.perf.llm import TokenLLMWorkload
from trtdeploy.perf.runner import InputSpec, LoadSettings
from trtdeploy.perf.trace import Trace, TraceRequest

#: Blocks of 4 tokens: requests 0 and 1 share blocks 0 and 1 (8 tokens), request 2 shares block 0 with them, request
#: 3 has no hash_ids (a prompt of its own), request 4 has more ids than its length reaches.
REQUESTS = [
    {"timestamp": 1000, "input_length": 12, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 1100, "input_length": 10, "output_length": 3, "hash_ids": [0, 1, 3]},
    {"timestamp": 1100, "input_length": 7, "output_length": 0, "hash_ids": [0, 4]},
    {"timestamp": 1450.5, "input_length": 9, "output_length": 2},
    {"timestamp": 2000, "input_length": 6, "output_length": 9, "hash_ids": [0, 5, 6, 7]},
]


def write_trace(path: Path, requests: list[dict] = REQUESTS) -> Path:
    path.write_text("".join(json.dumps(request) + "\n" for request in requests))
    return path


def test_a_trace_is_read_in_order_with_its_schedule(tmp_path):
    trace = Trace.load(write_trace(tmp_path / "trace.jsonl"), speedup=2.0, block_size=4)
    assert trace.requests[0] == TraceRequest(1000.0, 12, 5, (0, 1, 2))
    assert trace.requests[3].hash_ids == ()
    assert trace.schedule_ns() == (0, 50_000_000, 50_000_000, 225_250_000, 500_000_000)  # ms after the first, / 2
    described = f"trace {tmp_path / 'trace.jsonl'}: 5 requests over 1 s, replayed 2x faster, 4-token blocks"
    assert trace.describe(None) == described
    assert trace.clipped((10, 4)) == (1, 2)
    assert trace.describe((10, 4)).endswith("; clipped: 1 prompts to max_input_len 10, 2 answers to max_output_len 4")
    assert Trace.load(tmp_path / "trace.jsonl").block_size == 512  # the Mooncake traces' blocks


def test_requests_naming_the_same_blocks_share_those_tokens(tiny_tokenizer, tmp_path):
    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    trace = Trace.load(write_trace(tmp_path / "trace.jsonl"), block_size=4)
    spec = InputSpec(trace=trace, caps=(1000, 1000))
    rows = spec.synthetic_rows(workload, 0, 5, seed=1)
    ids = [workload.prompt_ids(row.input) for row in rows]
    assert [len(prompt) for prompt in ids] == [12, 10, 7, 9, 6]
    assert [row.max_tokens for row in rows] == [5, 3, 1, 2, 9]  # at least one token
    assert ids[1][:8] == ids[0][:8] and ids[1][8:] != ids[0][8:10]  # blocks 0, 1 shared; 3 is not 2
    assert ids[2][:4] == ids[0][:4] and ids[2][4:] != ids[0][4:7]  # block 0 shared
    assert ids[4][:4] == ids[0][:4] and ids[4][4:] != ids[0][4:6]  # block 5 cut to 2 tokens; 6, 7 unreached
    assert ids[3][:4] != ids[0][:4]  # no hash_ids: its own words
    assert spec.synthetic_rows(workload, 2, 3, seed=1) == rows[2:]  # made a few at a time, the same rows
    clipped = InputSpec(trace=trace, caps=(8, 4)).synthetic_rows(workload, 0, 5, seed=1)
    assert [len(workload.prompt_ids(row.input)) for row in clipped] == [8, 8, 7, 8, 6]
    assert [row.max_tokens for row in clipped] == [4, 3, 1, 2, 4]
    assert clipped[0].input == rows[0].input.rsplit(" ", 4)[0]  # the first 8 of the same words


def test_a_block_cut_short_is_the_start_of_the_whole_block(tiny_tokenizer, tmp_path):
    """Two requests naming block 9, one with all its 6 tokens, one with 2 of them (its last, partial block)."""
    workload = TokenLLMWorkload("tensorrt_llm", tiny_tokenizer)
    requests = [
        {"timestamp": 0, "input_length": 12, "output_length": 1, "hash_ids": [8, 9]},
        {"timestamp": 5, "input_length": 8, "output_length": 1, "hash_ids": [8, 9]},
    ]
    trace = Trace.load(write_trace(tmp_path / "trace.jsonl", requests), block_size=6)
    whole, cut = (
        workload.prompt_ids(row.input) for row in InputSpec(trace=trace).synthetic_rows(workload, 0, 2, seed=0)
    )
    assert cut == whole[:8]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"input_length": 5, "output_length": 1}', '"timestamp" must be a number of ms >= 0, got None'),
        ('{"timestamp": -1, "input_length": 5, "output_length": 1}', '"timestamp" must be a number of ms >= 0'),
        ('{"timestamp": 1, "input_length": 0, "output_length": 1}', '"input_length" must be an integer >= 1, got 0'),
        ('{"timestamp": 1, "input_length": 5}', '"output_length" must be an integer >= 0, got None'),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1.5}', '"output_length" must be an integer >= 0'),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}', '"hash_ids" must be a list'),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": 3}', '"hash_ids" must be a list'),
        ('{"timestamp": 0.5, "input_length": 5, "output_length": 1}', "timestamp 0.5 is before the previous request's"),
        ("[1, 2]", "expected a JSON object, got list"),
    ],
)
def test_a_bad_trace_line_is_named(tmp_path, line, message):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"timestamp": 1, "input_length": 5, "output_length": 1}\n\n' + line + "\n")
    with pytest.raises(UsageError, match=message) as caught:
        Trace.load(path)
    assert caught.value.message.startswith(f"{path}:3: ")


def test_a_missing_or_empty_trace(tmp_path):
    with pytest.raises(NotFoundError, match="does not exist"):
        Trace.load(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UsageError, match="has no requests"):
        Trace.load(tmp_path / "empty.jsonl")
    with pytest.raises(UsageError, match="--trace-speedup must be > 0"):
        Trace.load(write_trace(tmp_path / "trace.jsonl"), speedup=0.0)
    with pytest.raises(UsageError, match="--trace-block-size must be >= 1"):
        Trace.load(tmp_path / "trace.jsonl", block_size=0)


def test_a_trace_is_one_open_loop_level_at_its_times(tmp_path):
    """The level sends trace request i (row i) at its offset, at the replayed requests' mean rate."""
    schedule = Trace.load(write_trace(tmp_path / "trace.jsonl")).schedule_ns()  # 0, 100, 100, 450.5, 1000 ms
    load = LoadSettings(schedule_ns=schedule, workers=2, max_concurrency=2)
    (level,) = load.levels(rows=None)
    assert (level.rows, level.warmup_rows, level.schedule_ns, level.arrival) == (tuple(range(5)), (), schedule, "trace")
    assert level.request_rate == pytest.approx(4 / 1.0) and load.values == (level.request_rate,)
    shares = level.shares(2, seed=0, warmup=False)
    merged = sorted(
        (offset, seq) for share in shares for (seq, _, _), offset in zip(share.items, share.offsets_ns, strict=True)
    )
    assert merged == sorted(zip(schedule, range(5), strict=True)) and [share.cap for share in shares] == [1, 1]
    first = LoadSettings(schedule_ns=schedule, num_requests=4).levels(rows=None)[0]
    assert first.schedule_ns == schedule[:4] and first.request_rate == pytest.approx(3 / 0.4505)
    within = LoadSettings(schedule_ns=schedule, duration_s=0.5).levels(rows=None)[0]
    assert within.rows == (0, 1, 2, 3) and within.duration_s == 0.5 and within.planned == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"request_rates": (5.0,)}, "--trace sends its requests at the trace's times"),
        ({"arrival": "gamma", "burstiness": 0.5}, "--arrival gamma spaces requests of a --request-rate, not of a"),
        ({"find": "max-rate"}, "--find searches for a level, and --trace replays one"),
        ({"warmup": 2}, "a --trace is replayed from its first request, without warmup"),
        ({"num_requests": 1}, "the 1 requests of the trace that this run replays are all due at once"),
        ({"duration_s": 0.05}, "the 1 requests of the trace that this run replays are all due at once"),
    ],
)
def test_a_replay_is_checked(kwargs, message):
    with pytest.raises(UsageError, match=message):
        LoadSettings(schedule_ns=(0, 100_000_000, 300_000_000), **kwargs)
    with pytest.raises(UsageError, match="all due at once"):
        LoadSettings(schedule_ns=(0, 0, 0))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "trace.jsonl", "-c", "2"], "--trace sends its requests at the trace's times, as one open-loop"),
        (["--trace", "trace.jsonl", "--request-rate", "2"], "--trace sends its requests at the trace's times"),
        (["--trace", "trace.jsonl", "--osl", "4"], "--trace gives each request's output length"),
        (["--trace", "trace.jsonl", "--isl", "4"], "--trace and --isl are exclusive"),
        (["--trace", "trace.jsonl", "--trace-speedup", "-2"], "--trace-speedup must be > 0, got -2"),
        (["--trace-speedup", "2"], "--trace-speedup and --trace-block-size go with --trace"),
        (["--trace-block-size", "64"], "--trace-speedup and --trace-block-size go with --trace"),
        (["--trace", "missing.jsonl"], "input file missing.jsonl does not exist"),
        (["--shared-prefixes", "4"], "--shared-prefixes N and --prefix-len P go together"),
        (["--osl-from-reference"], "--osl-from-reference takes the output lengths from the references"),
    ],
)
def test_cli_trace_and_prefix_errors(args, message, capsys, tmp_path, monkeypatch):
    """Refused with one line each (exit 2 but a missing file's 3), before any server is looked for."""
    from trtdeploy.cli.main import main

    monkeypatch.setenv("TRTDEPLOY_STATE_DIR", str(tmp_path))  # no server recorded
    monkeypatch.chdir(tmp_path)  # no deployment
    write_trace(tmp_path / "trace.jsonl")
    with pytest.raises(SystemExit) as caught:
        main(["perf", *args])
    err = capsys.readouterr().err
    assert caught.value.code == (NotFoundError.exit_code if "missing" in message else 2), err
    assert err.startswith("Error: ") and message in " ".join(err.split())
