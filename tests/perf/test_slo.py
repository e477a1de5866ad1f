"""SLOs: what --slo accepts, which keys fit which workload, and how a level is held against them."""

from __future__ import annotations

import pytest

from trtdeploy.errors import UsageError
from trtdeploy.perf.slo import Limit, Slo

from .helpers import level, record, summarize_level


def test_limits_per_request_and_per_percentile():
    slo = Slo.parse(" ttft_ms<=200, itl_ms_p90 <= 12.5 ,rtf_p99.9<=1,", attainment=0.9)
    assert slo.limits == (Limit("ttft_ms", 200.0), Limit("itl_ms", 12.5, 90.0), Limit("rtf", 1.0, 99.9))
    assert [limit.key for limit in slo.percentiles] == ["itl_ms_p90", "rtf_p99.9"]
    assert slo.per_request == (Limit("ttft_ms", 200.0),)
    assert slo.describe() == "ttft_ms<=200 for 90% of requests, itl_ms_p90<=12.5, rtf_p99.9<=1"
    assert Slo.from_dict(slo.to_dict()) == slo
    assert Slo.parse("e2e_ms=500") == Slo.parse("e2e_ms<=500")  # the older KEY=LIMIT form
    assert Slo.parse("e2e_ms<=500").attainment == 0.95


@pytest.mark.parametrize(
    ("text", "attainment", "message"),
    [
        ("ttft_ms", None, "--slo: 'ttft_ms' is not KEY<=LIMIT"),
        ("<=5", None, "--slo: '<=5' is not KEY<=LIMIT"),
        ("ttft_ms<=fast", None, "--slo ttft_ms<=fast: the limit must be a number"),
        ("ttft_ms<=0", None, "--slo ttft_ms<=0: a limit must be > 0"),
        ("e2e_ms=-5", None, "--slo e2e_ms<=-5: a limit must be > 0"),
        ("e2e_ms<=nan", None, "--slo e2e_ms<=nan: a limit must be > 0"),
        ("ttft_ms>=5", None, "--slo ttft_ms>=5: limits are upper bounds"),
        ("ttft_ms<5", None, "--slo ttft_ms<5: limits are upper bounds"),
        ("latency_ms<=5", None, "--slo latency_ms<=5: unknown key 'latency_ms'"),
        ("rtf_p0<=1", None, "--slo rtf_p0<=1: the percentile must be > 0 and <= 100"),
        ("rtf_p101<=1", None, "--slo rtf_p101<=1: the percentile must be > 0 and <= 100"),
        ("rtf_q95<=1", None, "unknown key 'rtf_q95'"),
        ("ttft_ms<=1,ttft_ms<=2", None, "--slo gives ttft_ms twice"),
        (" , ", None, "--slo needs at least one limit"),
        ("ttft_ms<=1", 95.0, "--attainment must be > 0 and <= 1 (a share of the requests), got 95"),
        ("ttft_ms<=1", 0.0, "--attainment must be > 0 and <= 1"),
    ],
)
def test_bad_slos_are_one_line_usage_errors(text, attainment, message):
    with pytest.raises(UsageError) as caught:
        Slo.parse(text, attainment)
    assert message in caught.value.message
    assert caught.value.hint and "\n" not in caught.value.message


def test_keys_must_fit_the_workload_and_mode():
    Slo.parse("ttft_ms<=1,itl_ms_p90<=1,e2e_ms<=1").check("llm", stream=True)
    Slo.parse("first_chunk_ms_p95<=1,rtf_p95<=1").check("tts", stream=True)
    Slo.parse("ttft_ms<=1").check("llm", stream=None)  # the mode is not known yet: either will do
    with pytest.raises(UsageError, match="--slo rtf_p95 cannot be measured for llm requests") as caught:
        Slo.parse("rtf_p95<=1").check("llm", stream=None)
    assert caught.value.hint.startswith("SLO keys here: ttft_ms, itl_ms, e2e_ms")
    with pytest.raises(UsageError, match="--slo ttft_ms cannot be measured for offline \\(not streamed\\) llm"):
        Slo.parse("ttft_ms<=1").check("llm", stream=False)
    with pytest.raises(UsageError, match="--slo first_chunk_ms cannot be measured for offline"):
        Slo.parse("first_chunk_ms<=1").check("tts", stream=False)
    with pytest.raises(UsageError, match="--slo ttft_ms cannot be measured for streamed tts requests"):
        Slo.parse("ttft_ms<=1").check("tts", stream=True)


def test_a_request_without_a_value_meets_no_limit_on_it():
    tts = Slo.parse("first_chunk_ms<=100,rtf<=1")
    assert not tts.meets({"first_chunk_ms": None, "rtf": None, "e2e_ms": 5})
    assert not tts.meets({"first_chunk_ms": 10, "rtf": None, "e2e_ms": 5})
    assert tts.meets({"first_chunk_ms": 10, "rtf": 0.5, "e2e_ms": 5})
    itl = Slo.parse("itl_ms<=8")
    assert itl.meets({"ttft_ms": 5, "itl_ms": None})  # every token in the first chunk: no gap to exceed
    assert not itl.meets({"ttft_ms": None, "itl_ms": None})  # no token at all


def _level_of(e2e_ms: list[float | None], slo: str) -> dict:
    """A level of offline requests sent at 0 and ending after ``e2e_ms`` each (None: failed at 1 ms)."""
    records = [
        record(0, 1, seq=i, error="boom") if ms is None else record(0, ms, [(ms, 1)], seq=i)
        for i, ms in enumerate(e2e_ms)
    ]
    return summarize_level(records, level(1, len(records)), stream=False, family="llm", slo=slo)


def test_attainment_is_the_share_of_requests_meeting_every_per_request_limit():
    twenty = [10.0] * 19 + [50.0]
    met = _level_of(twenty, "e2e_ms<=20")
    assert met["attainment"] == pytest.approx(0.95) and met["slo_met"] is True  # 19 of 20 reach 0.95
    missed = _level_of([*twenty[:18], 50.0, 50.0], "e2e_ms<=20")
    assert missed["attainment"] == pytest.approx(0.9) and missed["slo_met"] is False
    failed = _level_of([*twenty[:19], None], "e2e_ms<=20")  # a failed request meets no limit
    assert failed["attainment"] == pytest.approx(0.95) and failed["slo_met"] is True
    assert _level_of([10.0] * 4, "e2e_ms<=20")["slo_percentiles"] is None  # no percentile limit asked


def test_percentile_limits_take_the_nearest_rank_over_every_measured_request():
    values = [float(v) for v in range(1, 21)]  # 1..20 ms
    level = _level_of(values, "e2e_ms_p90<=18,e2e_ms_p50<=9")
    assert level["slo_percentiles"] == {"e2e_ms_p90": 18.0, "e2e_ms_p50": 10.0}  # ranks 18 and 10 of 20
    assert level["attainment"] == 1.0  # no per-request limit: every successful request counts
    assert level["slo_met"] is False  # p50 10 > 9
    assert _level_of(values, "e2e_ms_p90<=18")["slo_met"] is True
    # two failed requests count as above any limit: the 90th percentile is the 18th of 20 ranks, still a value
    with_failures = _level_of([*values[:18], None, None], "e2e_ms_p90<=18")
    assert with_failures["slo_percentiles"] == {"e2e_ms_p90": 18.0} and with_failures["attainment"] == 0.9
    # percentile limits alone decide: the 90% attainment (below the default 95%) is not a hidden limit
    assert with_failures["slo_met"] is True
    median = _level_of([*[1.0] * 18, None, None], "e2e_ms_p50<=100")
    assert median["attainment"] == 0.9 and median["slo_met"] is True
    # three reach rank 18: no value there, and the limit does not hold
    worse = _level_of([*values[:17], None, None, None], "e2e_ms_p90<=1000")
    assert worse["slo_percentiles"] == {"e2e_ms_p90": None} and worse["slo_met"] is False


def test_attainment_target_and_percentiles_together():
    values = [10.0] * 18 + [30.0, 40.0]
    assert _level_of(values, "e2e_ms<=35,e2e_ms_p90<=10")["slo_met"] is True  # 19/20 within 35; p90 is 10
    assert _level_of(values, "e2e_ms<=35,e2e_ms_p95<=10")["slo_met"] is False  # p95 is 30


@pytest.mark.parametrize("percentile", [7, 14, 28, 50, 55, 56, 68, 90, 95, 99])
def test_the_nearest_rank_is_exact_for_whole_percentiles(percentile):
    # 1..100 ms: the p-th percentile of a hundred requests is the p-th value (a float product once gave p55 = 56)
    level = _level_of([float(v) for v in range(1, 101)], f"e2e_ms_p{percentile}<=1000")
    assert level["slo_percentiles"] == {f"e2e_ms_p{percentile}": float(percentile)}
