"""The --find search as a policy: given a verdict for every level, which levels it runs and what it finds."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from trtdeploy.errors import UsageError
from trtdeploy.perf.runner import LoadSettings
from trtdeploy.perf.search import MAX_STEPS, RATE_PRECISION, Search, check_search
from trtdeploy.perf.slo import Slo


def search(find: str, start: float, meets: Callable[[float], bool]) -> Search:
    """Run the search to its end over levels whose verdicts ``meets`` gives."""
    policy = Search(find, start)
    while (value := policy.next_value()) is not None:
        assert value not in [tried for tried, _ in policy.tried], f"{value} run twice"
        policy.record(value, meets(value))
    return policy


@pytest.mark.parametrize("highest", [1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 100, 255, 256, 1000])
def test_it_finds_the_highest_concurrency_with_the_levels_of_a_doubling_and_a_bisection(highest):
    """Doubling 1, 2, 4, ... to the first power of two that fails (2**k, k + 1 levels), then bisecting the k - 1
    halvings of the gap between 2**(k - 1) and 2**k: 2k levels, what a doubling then bisection by hand costs."""
    found = search("max-concurrency", 1, lambda concurrency: concurrency <= highest)
    k = math.ceil(math.log2(highest + 1))
    assert found.found == highest and found.failed == highest + 1
    assert len(found.tried) == 2 * k
    assert [value for value, _ in found.tried[: k + 1]] == [2**i for i in range(k + 1)]
    summary = found.summary()
    assert summary["found"] == highest and summary["levels_run"] == 2 * k and summary["ceiling_reached"] is False
    assert found.tried[summary["level"]] == (highest, True)


def test_a_first_level_that_misses_halves_down_until_one_meets():
    found = search("max-concurrency", 8, lambda concurrency: concurrency <= 3)
    assert [value for value, _ in found.tried] == [8, 4, 2, 3] and found.found == 3
    nothing = search("max-concurrency", 1, lambda concurrency: False)
    assert nothing.tried == [(1, False)] and nothing.found is None and nothing.summary()["level"] is None
    lowest = search("max-concurrency", 16, lambda concurrency: False)
    assert [value for value, _ in lowest.tried] == [16, 8, 4, 2, 1]


def test_it_stops_at_the_ceiling_when_every_level_meets_the_slo():
    found = search("max-concurrency", 2, lambda concurrency: True)
    assert [value for value, _ in found.tried] == [2 * 2**i for i in range(MAX_STEPS + 1)]
    assert found.found == 2 * 2**MAX_STEPS and found.summary()["ceiling_reached"] is True


@pytest.mark.parametrize(("start", "highest"), [(1.0, 7.3), (4.0, 4.1), (10.0, 0.3), (2.0, 1000.0)])
def test_it_finds_the_highest_rate_within_the_precision(start, highest):
    found = search("max-rate", start, lambda rate: rate <= highest)
    assert found.found is not None and found.failed is not None
    assert found.found <= highest < found.failed <= found.found * (1 + RATE_PRECISION)
    doubling = abs(math.log2(found.failed / start)) + 1 if found.failed > start else math.log2(start / found.found) + 1
    bisection = math.ceil(math.log2(1 / RATE_PRECISION)) + 1
    assert len(found.tried) <= doubling + bisection


def test_noisy_verdicts_still_bracket_the_answer():
    """Verdicts that are not monotone (a level that misses below one that meets): what the search finds met the
    SLO, and the next concurrency up was run and missed it."""
    rng = random.Random(7)
    for _ in range(200):
        meeting = {value for value in range(1, 300) if rng.random() < 0.8}
        found = search("max-concurrency", 1, meeting.__contains__)
        if found.found is None:
            assert found.tried == [(1, False)]
            continue
        assert (found.found, True) in found.tried and (found.found + 1, False) in found.tried


def test_the_search_is_checked_with_the_load():
    LoadSettings(find="max-concurrency", concurrency=(4,))
    LoadSettings(find="max-rate", request_rates=(2.0,))
    cases = [
        ({"find": "max-concurrency", "concurrency": (1, 2)}, "--find starts from one --concurrency value, got 1,2"),
        ({"find": "max-rate"}, "--find max-rate searches open-loop levels from a first rate"),
        ({"find": "max-concurrency", "request_rates": (1.0,)}, "--find max-concurrency searches closed-loop levels"),
        ({"find": "max-rate", "request_rates": (1.0, 2.0)}, "--find starts from one --request-rate value"),
        ({"find": "min-latency"}, "--find 'min-latency' is not one of max-concurrency, max-rate"),
    ]
    for kwargs, message in cases:
        with pytest.raises(UsageError, match=message):
            LoadSettings(**kwargs)
    with pytest.raises(UsageError, match="--find max-rate looks for the highest level that meets --slo"):
        check_search("max-rate", None)
    check_search("max-rate", Slo.parse("e2e_ms<=1"))


def test_a_search_level_sends_at_least_16_requests_whatever_the_input():
    from trtdeploy.perf.runner import LevelPlan

    plan = LevelPlan(LoadSettings(find="max-concurrency"), rows=1000)
    assert [plan.level(value).num_requests for value in (1, 2, 8)] == [16, 16, 32]


def test_a_failing_rate_search_halves_no_lower_than_a_level_that_sends_its_requests_in_a_minute():
    load = LoadSettings(find="max-rate", request_rates=(4.0,))
    assert load.lowest_search_rate == pytest.approx(16 / 60)  # 16 requests within 60 s
    policy = Search("max-rate", 4.0, lowest_rate=load.lowest_search_rate)
    while (value := policy.next_value()) is not None:
        policy.record(value, False)
    assert [value for value, _ in policy.tried] == [4.0, 2.0, 1.0, 0.5]  # 0.25/s would take 64 s
    timed = LoadSettings(find="max-rate", request_rates=(4.0,), duration_s=30.0)
    assert timed.lowest_search_rate == pytest.approx(16 / 30)


def test_a_searched_level_has_at_least_as_many_requests_as_slots_whatever_num_requests():
    from trtdeploy.perf.runner import LevelPlan

    plan = LevelPlan(LoadSettings(find="max-concurrency", num_requests=8), rows=None)
    assert [plan.level(value).num_requests for value in (1, 8, 64)] == [16, 32, 256]
    fixed = LevelPlan(LoadSettings(concurrency=(1, 64), num_requests=8), rows=None)
    assert [fixed.level(value).num_requests for value in (1, 64)] == [8, 8]  # outside a search it is the count


def test_a_duration_that_expects_no_arrival_is_refused():
    with pytest.raises(UsageError, match="expects no request at all"):
        LoadSettings(request_rates=(0.1,), duration_s=5.0)
    LoadSettings(request_rates=(0.1,), duration_s=20.0)  # two expected


def test_after_a_search_only_the_found_level_is_held_to_the_error_rate():
    from trtdeploy.errors import PerfError
    from trtdeploy.perf.runner import PerfRun

    def level(concurrency: int, errors: int) -> dict:
        return {"concurrency": concurrency, "request_rate": None, "errors": errors, "requests": 16,
                "error_rate": errors / 16, "error_messages": {"timed out": errors} if errors else {}}  # fmt: skip

    levels = [level(1, 0), level(2, 0), level(4, 3), level(3, 0)]  # 4 is past capacity: timeouts are its verdict
    PerfRun({"levels": levels, "search": {"found": 3, "level": 3}}).check_error_rate(0.0)
    with pytest.raises(PerfError, match="3 of 16 requests failed at concurrency 4"):
        PerfRun({"levels": levels}).check_error_rate(0.0)  # without a search every level counts
    failing_found = [*levels[:3], level(3, 1)]
    with pytest.raises(PerfError, match="1 of 16"):
        PerfRun({"levels": failing_found, "search": {"found": 3, "level": 3}}).check_error_rate(0.0)
    PerfRun({"levels": levels, "search": {"found": None, "level": None}}).check_error_rate(0.0)
