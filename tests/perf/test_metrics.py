"""Metric definitions on hand-computed cases."""

from __future__ import annotations

import math
import random

import pytest

from trtdeploy.perf.metrics import (
    describe,
    lcs_length,
    request_metrics,
    rouge_l_f1,
    underruns,
)

from .helpers import level, record, summarize_level


def test_describe_uses_linear_percentiles_and_population_std():
    stats = describe([4.0, 1.0, 3.0, 2.0])
    assert stats["count"] == 4
    assert stats["mean"] == 2.5
    assert stats["std"] == pytest.approx(math.sqrt(1.25))
    assert (stats["min"], stats["max"]) == (1.0, 4.0)
    # linear interpolation between order statistics: position q/100 * (n - 1)
    assert stats["p50"] == pytest.approx(2.5)
    assert stats["p90"] == pytest.approx(3.7)
    assert stats["p95"] == pytest.approx(3.85)
    assert stats["p99"] == pytest.approx(3.97)
    assert describe([]) is None


def test_streamed_request_ttft_itl_e2e():
    # sent at 0; chunks at 10 ms (2 tokens), 20 ms (1), 40 ms (3); final at 50 ms
    rec = record(0, 50, [(10, 2), (20, 1), (40, 3)])
    m = request_metrics(rec, stream=True, family="llm")
    assert m["ttft_ms"] == pytest.approx(10)
    assert m["e2e_ms"] == pytest.approx(50)
    assert m["itl_ms"] == pytest.approx((50 - 10) / (6 - 2))  # tokens of the first chunk excluded
    assert m["output_tokens_per_user"] == pytest.approx(1000 / m["itl_ms"])  # AIPerf's: 1 / ITL, no TTFT in it
    assert m["icl_ms"] == pytest.approx([10, 20])


def test_itl_undefined_when_every_token_came_in_the_first_chunk():
    m = request_metrics(record(0, 30, [(10, 4)]), stream=True, family="llm")
    assert m["ttft_ms"] == pytest.approx(10)
    assert m["itl_ms"] is None


def test_offline_request_has_no_ttft_or_itl():
    m = request_metrics(record(5, 25, [(25, 8)]), stream=False, family="llm")
    assert m["e2e_ms"] == pytest.approx(20)
    assert m["ttft_ms"] is None and m["itl_ms"] is None
    assert m["icl_ms"] == []


def test_level_window_throughput_goodput_and_errors():
    records = [
        record(-50, -10, [(-40, 1), (-10, 4)], seq=0, warmup=True),  # warmup: outside every number
        record(0, 100, [(20, 1), (100, 4)], seq=1),  # ttft 20, itl 20, e2e 100
        record(10, 60, [(15, 1), (60, 4)], seq=2),  # ttft 5, itl 11.25, e2e 50
        record(30, 40, seq=3, error="boom"),  # failed: counted, inside the window, not in latencies
    ]
    summary = summarize_level(
        records, level(concurrency=2, num_requests=3, warmup=1), stream=True, family="llm", slo="e2e_ms<=80"
    )
    assert summary["requests"] == 3 and summary["warmup_requests"] == 1
    assert summary["completed"] == 2 and summary["errors"] == 1
    assert summary["error_rate"] == pytest.approx(1 / 3)
    assert summary["duration_s"] == pytest.approx(0.100)  # first measured send (0) to last end (100 ms)
    assert summary["request_throughput"] == pytest.approx(2 / 0.100)
    assert summary["output_token_throughput"] == pytest.approx(10 / 0.100)
    assert summary["input_token_throughput"] == pytest.approx(20 / 0.100)
    assert summary["achieved_concurrency"] == pytest.approx((100 + 50 + 10) / 100)
    assert summary["goodput"] == pytest.approx(1 / 0.100)  # only the 50 ms request meets e2e <= 80 ms
    assert summary["attainment"] == pytest.approx(1 / 3) and summary["slo_met"] is False  # the failed one too
    assert summary["ttft_ms"]["count"] == 2
    assert summary["ttft_ms"]["mean"] == pytest.approx(12.5)
    assert summary["itl_ms"]["max"] == pytest.approx(20)
    assert summary["e2e_ms"]["p50"] == pytest.approx(75)
    assert summary["error_messages"] == {"boom": 1}
    assert summary["token_source"] == "server"
    assert summary["accuracy"] is None


def test_goodput_needs_every_slo_and_a_one_chunk_answer_meets_itl():
    records = [
        record(0, 40, [(10, 1), (40, 4)], seq=0),  # ttft 10, itl 7.5
        record(0, 40, [(30, 1), (40, 2)], seq=1),  # ttft 30 > 20
        record(0, 40, [(5, 3)], seq=2),  # itl undefined (every token in the first chunk): meets the itl SLO
    ]
    summary = summarize_level(records, level(num_requests=3), stream=True, family="llm", slo="ttft_ms<=20,itl_ms<=8")
    assert summary["goodput"] == pytest.approx(2 / 0.040)


def test_throughput_is_none_when_token_counts_are_unknown():
    summary = summarize_level(
        [record(0, 10, input_tokens=None)],
        level(1, 1),
        stream=False,
        family="llm",
    )
    assert summary["output_token_throughput"] is None
    assert summary["input_token_throughput"] is None
    assert summary["goodput"] is None and summary["attainment"] is None and summary["slo_met"] is None


def test_accuracy_exact_match_after_whitespace_and_rouge_l():
    records = [
        record(0, 10, [(10, 3)], seq=0, text="  the cat\nsat ", reference="the cat sat"),
        record(0, 10, [(10, 6)], seq=1, text="the cat sat on the mat", reference="the cat is on the mat"),
        record(0, 10, [(10, 1)], seq=2, text="x"),  # no reference: not scored
    ]
    accuracy = summarize_level(
        records,
        level(1, 3),
        stream=False,
        family="llm",
    )["accuracy"]
    assert accuracy["requests"] == 2
    assert accuracy["exact_match"] == pytest.approx(0.5)
    assert accuracy["rouge_l_f1"] == pytest.approx((1 + 5 / 6) / 2)


def test_rouge_l_f1_hand_cases():
    # LCS "the cat on the mat" = 5 of 6 tokens each way: P = R = F1 = 5/6
    assert rouge_l_f1("the cat sat on the mat", "the cat is on the mat") == pytest.approx(5 / 6)
    # LCS "a c" = 2: P = 2/3, R = 2/2 → F1 = 0.8
    assert rouge_l_f1("a b c", "a c") == pytest.approx(0.8)
    assert rouge_l_f1("x y", "a b") == 0.0
    assert rouge_l_f1("", "") == 1.0
    assert rouge_l_f1("", "a") == 0.0


def _lcs_table(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_bit_parallel_lcs_matches_the_dynamic_programming_table():
    rng = random.Random(7)
    for _ in range(500):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 40))]
        b = [rng.choice("abcde") for _ in range(rng.randint(0, 40))]
        assert lcs_length(a, b) == _lcs_table(a, b)


def test_underruns_count_chunks_arriving_after_the_audio_ran_out():
    ms = 1_000_000
    # playback starts at 0 with 0.1 s; the chunk at 0.05 s is in time, the one at 0.5 s is late (0.2 s played)
    assert underruns([0, 50 * ms, 500 * ms], [0.1, 0.1, 0.1]) == 1
    assert underruns([], []) == 0


def test_tts_level_rtf_and_chunk_latencies():
    records = [record(0, 500, [(100, 0), (300, 0)], seq=0, audio=[0.5, 0.5], characters=40)]
    summary = summarize_level(records, level(1, 1), stream=True, family="tts", slo="rtf<=1")
    assert summary["first_chunk_ms"]["p50"] == pytest.approx(100)
    assert summary["second_chunk_ms"]["p50"] == pytest.approx(200)
    assert summary["rtf"]["p50"] == pytest.approx(0.5)  # 0.5 s of wall time for 1 s of audio
    assert summary["rtf_aggregate"] == pytest.approx(0.5)
    assert summary["audio_seconds"] == pytest.approx(1.0)
    assert summary["underrun_requests"] == 0
    assert summary["goodput"] == pytest.approx(1 / 0.5)
    assert summary["characters_per_second"] == pytest.approx(40 / 0.5)  # the text spoken per second of the window


def _zero_token(send: float, end: float, seq: int):
    """A successful request that generated nothing: no chunk with content, 0 output tokens."""
    rec = record(send, end, seq=seq)
    rec.output_tokens, rec.token_source = 0, "server"
    return rec


def test_zero_token_answers_count_as_successes_without_ttft():
    records = [record(0, 40, [(10, 1), (40, 4)], seq=0), _zero_token(0, 20, seq=1)]  # ttft 10, itl 10; e2e 20
    summary = summarize_level(
        records,
        level(2, 2),
        stream=True,
        family="llm",
    )
    assert summary["completed"] == 2 and summary["errors"] == 0
    assert summary["zero_output_requests"] == 1
    assert summary["output_token_throughput"] == pytest.approx(5 / 0.040)  # a number, not None
    assert summary["output_tokens"]["min"] == 0 and summary["output_tokens"]["count"] == 2
    assert summary["ttft_ms"]["count"] == 1 and summary["itl_ms"]["count"] == 1  # no first token, no gaps
    assert summary["e2e_ms"]["count"] == 2
    zero = request_metrics(records[1], stream=True, family="llm")
    assert zero["ttft_ms"] is None and zero["itl_ms"] is None and zero["output_tokens_per_user"] is None


@pytest.mark.parametrize(
    ("slo", "meeting"),
    [
        ("ttft_ms<=1000", 2),  # the zero-token answer produced no first token in time
        ("itl_ms<=1000", 2),  # ...nor tokens at a rate; the one-chunk answer has no gap to exceed
        ("e2e_ms<=1000", 3),
        ("ttft_ms<=1000,itl_ms<=1000", 2),
    ],
)
def test_zero_token_answers_meet_no_ttft_or_itl_slo(slo, meeting):
    records = [
        record(0, 40, [(10, 1), (40, 4)], seq=0),
        record(0, 40, [(5, 3)], seq=1),  # every token in the first chunk: no ITL
        _zero_token(0, 20, seq=2),
    ]
    summary = summarize_level(records, level(1, 3), stream=True, family="llm", slo=slo)
    assert summary["goodput"] == pytest.approx(meeting / 0.040)
