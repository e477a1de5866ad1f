"""The planner and its simulation against closed forms: M/M/c queues (Erlang C), and the balancers' order."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from trtdeploy.capacity import Load, hpa_target, plan
from trtdeploy.capacity import simulate as simulate_module
from trtdeploy.capacity.plan import held_against
from trtdeploy.capacity.simulate import latencies, simulate, twin_table

from .runs import busier_is_slower_curve, exponential_curve, mmc_mean_in_system, mmc_response_quantile

plan_module = sys.modules["trtdeploy.capacity.plan"]  # the package's ``plan`` is the function


@pytest.mark.parametrize("balancing", ["round-robin", "least-requests", "random"])
def test_one_replica_of_exponential_servers_queues_as_mmc(balancing):
    """With one replica every balancer feeds it Poisson arrivals: an M/M/4 queue at 80% load."""
    curve = exponential_curve("e2e_ms_p99<=6000", slots=4)
    outcome = simulate(curve, 1, Load(3.2, duration_s=20_000, seed=1), balancing)
    e2e = latencies(curve, outcome)["e2e_ms"] / 1e3
    assert outcome.wait_s.max() > 0  # requests did queue
    for q in (0.5, 0.99):
        expected = mmc_response_quantile(3.2, 4, 1.0, q)
        assert np.quantile(e2e, q) == pytest.approx(expected, rel=0.1), q


def test_the_planner_finds_the_fewest_replicas_that_meet_the_slo():
    """Random balancing splits Poisson arrivals into independent M/M/4 queues at rate / n: the closed form says
    6 replicas miss a p99 of 6.5 s at 20 req/s and 7 meet it, each by a margin beyond the simulation's noise."""
    limit_s = 6.5
    assert mmc_response_quantile(20 / 6, 4, 1.0, 0.99) > 1.15 * limit_s
    assert mmc_response_quantile(20 / 7, 4, 1.0, 0.99) < 0.9 * limit_s
    curve = exponential_curve(f"e2e_ms_p99<={limit_s * 1e3:g}", slots=4)
    found = plan(curve, 20, balancing=("random",), headroom=0, load=Load(20, duration_s=20_000, seed=3))
    assert found.replicas_for_throughput == 5  # 4 req/s each: 5 replicas would run at 100%
    assert found.replicas == 7
    assert dict(found.tried)[6] is False
    assert found.gpus == 7 and found.pods == 7
    (simulated,) = found.simulated
    p99 = simulated.slo_percentiles["e2e_ms_p99"]
    assert p99 == pytest.approx(mmc_response_quantile(20 / 7, 4, 1.0, 0.99) * 1e3, rel=0.1)


def test_headroom_sets_the_replicas_when_the_slo_alone_needs_fewer():
    curve = exponential_curve("e2e_ms_p99<=20000", slots=4)
    found = plan(curve, 20, balancing=("round-robin",), headroom=0.5, load=Load(20, duration_s=2000))
    assert found.replicas == found.replicas_for_throughput == 10  # 2 req/s each: half of a replica's 4
    assert found.tried == ((10, True),)


def test_least_requests_is_never_worse_than_round_robin_on_identical_replicas():
    curve = busier_is_slower_curve("e2e_ms_p99<=10000")
    load = Load(8 * 0.85 * curve.best.throughput, duration_s=2000, seed=5)
    p99 = {}
    for balancing in ("round-robin", "least-requests", "random"):
        values = latencies(curve, simulate(curve, 8, load, balancing))
        p99[balancing] = {metric: np.nanpercentile(column, 99) for metric, column in values.items()}
    for metric in ("e2e_ms", "ttft_ms"):
        assert p99["least-requests"][metric] <= p99["round-robin"][metric] <= p99["random"][metric], metric
    assert p99["least-requests"]["itl_ms"] == 5.0  # not affected by queueing


def test_replicas_routed_in_advance_are_the_same_stepped_at_once_or_in_turn(monkeypatch):
    curve = busier_is_slower_curve("e2e_ms_p99<=10000")
    load = Load(20 * 0.9 * curve.best.throughput, duration_s=300, seed=2)
    at_once = simulate(curve, 20, load, "round-robin")
    monkeypatch.setattr(simulate_module, "_VECTORISED_FROM", 1000)
    in_turn = simulate(curve, 20, load, "round-robin")
    assert at_once.wait_s.max() > 0
    np.testing.assert_allclose(at_once.wait_s, in_turn.wait_s, atol=1e-9)
    np.testing.assert_array_equal(at_once.twin, in_turn.twin)


def test_a_request_is_drawn_from_the_levels_around_its_concurrency():
    curve = busier_is_slower_curve("e2e_ms_p99<=10000", concurrencies=(2, 4))
    table = twin_table(curve, 4)
    low, high = curve.levels
    in_level = [(table[k] >= high.start).mean() for k in (1, 2, 3, 4)]
    assert in_level == [0.0, 0.0, 0.5, 1.0]  # below the lowest level: its requests; half way: half of each


def test_the_hpa_target_is_one_replicas_mean_in_flight_under_poisson_arrivals():
    """An M/M/4 replica at 75% load holds 3 in service and Erlang C's queue on average: more than the 3 in flight
    that the closed loop needed for the same 3 req/s."""
    curve = exponential_curve("e2e_ms_p99<=6000", slots=4)  # k requests in flight serve k req/s
    target = hpa_target(curve, headroom=0.25)
    assert (target.slots, target.throughput) == (4, 4.0)
    assert target.rate == pytest.approx(3.0)
    assert mmc_mean_in_system(3.0, 4, 1.0) == pytest.approx(4.53, abs=0.01)
    assert target.in_flight == pytest.approx(mmc_mean_in_system(3.0, 4, 1.0), rel=0.05)


@pytest.mark.parametrize("headroom", [0.0, 0.2])
def test_a_planned_fleet_holds_less_in_flight_than_its_hpa_target(headroom):
    """At the planned load an HPA on the target does not scale out: every balancer leaves it headroom."""
    curve = busier_is_slower_curve("e2e_ms_p99<=10000")
    rate = 5.5 * (1 - headroom) * curve.best.throughput
    found = plan(curve, rate, balancing=("round-robin", "least-requests", "random"), headroom=headroom,
                 load=Load(rate, duration_s=2000, seed=4))  # fmt: skip
    assert found.replicas_for_throughput == 6
    for simulated in found.simulated:
        assert simulated.in_flight <= found.hpa.in_flight * 1.03, simulated.balancing  # random: Poisson, as the target
        if simulated.balancing != "random":
            assert simulated.hpa_headroom > 0, simulated.balancing


@pytest.mark.parametrize("vectorised", [False, True])
@pytest.mark.parametrize("slo", ["e2e_ms_p99<=3500", "ttft_ms_p90<=160,e2e_ms_p50<=2000", "e2e_ms<=3500"])
def test_a_simulation_stops_early_only_when_the_whole_load_misses_the_slo(monkeypatch, vectorised, slo):
    """Around the fewest replicas that meet it, a simulation told the SLO never stops where the whole load meets it
    (and then is the whole load's), and does stop where it misses by more than a little."""
    monkeypatch.setattr(simulate_module, "_REQUESTS_PER_LOOK", 256)
    monkeypatch.setattr(simulate_module, "_STEPS_PER_LOOK", 4)
    if vectorised:
        monkeypatch.setattr(simulate_module, "_VECTORISED_FROM", 1)
    curve = busier_is_slower_curve(slo)
    load = Load(6 * curve.best.throughput, duration_s=1500, seed=8)
    seen = set()
    for replicas in (5, 6, 7, 8, 10):
        for balancing in ("round-robin", "least-requests", "random"):
            whole = simulate(curve, replicas, load, balancing)
            met = held_against(curve.slo, latencies(curve, whole))[2]
            stopped = simulate(curve, replicas, load, balancing, stop_past=curve.slo)
            if met:
                assert stopped is not None, (replicas, balancing)
                np.testing.assert_array_equal(stopped.wait_s, whole.wait_s)
            seen.add("met" if met else "missed, stopped" if stopped is None else "missed, ran on")
    assert {"met", "missed, stopped"} <= seen


def test_scouting_on_a_shorter_load_leaves_the_plan_unchanged(monkeypatch):
    curve = busier_is_slower_curve("e2e_ms_p99<=3500")
    rate = 6 * curve.best.throughput
    options = {"balancing": ("round-robin", "least-requests"), "headroom": 0, "load": Load(rate, duration_s=1500)}
    monkeypatch.setattr(plan_module, "_SCOUT_REQUESTS", 10**9)
    whole = plan(curve, rate, **options)
    monkeypatch.setattr(plan_module, "_SCOUT_REQUESTS", 2000)
    scouted = plan(curve, rate, **options)
    assert whole.tried[0] == (6, False)  # the throughput's count misses: the search ran
    assert whole.scouted == () and scouted.scouted
    assert scouted.replicas == whole.replicas
    assert scouted.simulated == whole.simulated
    both = dict(whole.tried).keys() & dict(scouted.tried).keys()
    assert {n: dict(whole.tried)[n] for n in both} == {n: dict(scouted.tried)[n] for n in both}
