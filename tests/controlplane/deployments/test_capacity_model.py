"""Capacity planning's arithmetic: the curve as parsed, the simulated replica, the plan and its cost."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from controlplane.deployments.capacity.curve import LoadCurve
from controlplane.deployments.capacity.plan import PlanError, Targets, plan_replicas, replica_capacity
from controlplane.deployments.capacity.simulate import Load, simulate


def curve_dict(**changes) -> dict:
    base = {"version": 1, "decode": [[1, 0.010], [4, 0.013], [16, 0.025]], "context_tokens": 32,
            "long_context": {"batch": 2, "tokens": 512, "seconds": 0.0135}, "prefill": [[32, 0.014], [128, 0.038],
                                                                                      [512, 0.134]],
            "max_num_seqs": 16, "max_num_batched_tokens": 512, "kv_cache_tokens": 20000, "threads": 1,
            "device": "cpu", "sweep_seconds": 3.2}
    return {**base, **changes}


CURVE = LoadCurve.from_dict(curve_dict())


def test_the_step_model_interpolates_the_measured_points_and_adds_prefill_and_context():
    # decode: exact at measured sizes, linear between, the last slope beyond
    assert CURVE.step_seconds(1, 0) == pytest.approx(0.010)
    assert CURVE.step_seconds(4, 0) == pytest.approx(0.013)
    assert CURVE.step_seconds(10, 0) == pytest.approx(0.013 + 0.012 * 6 / 12)
    assert CURVE.step_seconds(32, 0) == pytest.approx(0.025 + 0.012 / 12 * 16)
    # prefill: linear between (32, .014) (128, .038) (512, .134), from the origin below, the last slope beyond
    assert CURVE.step_seconds(0, 100) == pytest.approx(0.014 + 0.024 * 68 / 96)
    assert CURVE.step_seconds(0, 16) == pytest.approx(0.007)
    assert CURVE.step_seconds(0, 1024) == pytest.approx(0.134 + 0.096 / 384 * 512)
    # a mixed step runs every token through the same matmuls: prefill(n + b), or decode(b) if that is more
    assert CURVE.step_seconds(4, 100) == pytest.approx(0.014 + 0.024 * 72 / 96)
    assert CURVE.step_seconds(16, 1) == pytest.approx(0.025)
    # context: the long point's excess over the short one, per request per token
    slope = (0.0135 - CURVE.step_seconds(2, 0)) / (2 * (512 - 32))
    assert CURVE.context_slope == pytest.approx(slope)
    assert CURVE.step_seconds(4, 0, mean_context=1032) == pytest.approx(0.013 + 4 * 1000 * slope)
    assert CURVE.step_seconds(4, 0, mean_context=10) == pytest.approx(0.013)  # a short context costs no less


@pytest.mark.parametrize("changes", [
    {"version": 2}, {"decode": []}, {"decode": [[1, 0.01], [1, 0.02]]}, {"decode": [[0, 0.01]]},
    {"decode": [[1, -0.01]]}, {"decode": [[1, float("nan")]]}, {"decode": [[1, float("inf")]]},
    {"decode": [[True, 0.01]]}, {"decode": [[1.5, 0.01]]}, {"decode": [[1, "0.01"]]}, {"decode": [[1]]},
    {"decode": [[i + 1, 0.01] for i in range(65)]}, {"prefill": "x"}, {"max_num_seqs": 0},
    {"kv_cache_tokens": None}, {"context_tokens": -1}, {"long_context": {"batch": 2, "tokens": 512}},
    {"long_context": [1]}, {"decode": [[1, 1e9]]},
])
def test_a_malformed_curve_is_refused_with_a_value_error(changes):
    with pytest.raises(ValueError, match="load curve"):
        LoadCurve.from_dict(curve_dict(**changes))
    with pytest.raises(ValueError):
        LoadCurve.from_dict(["not", "a", "dict"])


def test_one_request_alone_costs_a_prefill_and_then_a_decode_step_per_token():
    out = simulate(CURVE, Load(0.01, 128, 9), requests=200)
    assert out.ttft_p95 == pytest.approx(CURVE.step_seconds(0, 128), rel=1e-6)
    assert out.itl_p95 == pytest.approx(CURVE.step_seconds(1, 0, 129), rel=0.05)
    assert out.utilisation < 0.05 and not out.saturated and out.requests == 180


def test_latency_grows_with_load_and_a_load_beyond_throughput_saturates():
    # Throughput bound at 16 seats: a request holds a seat for >= 31 steps of >= 25 ms, plus its prefill.
    bound = 16 / (31 * 0.025 + CURVE.step_seconds(0, 128))
    outcomes = [simulate(CURVE, Load(r, 128, 32)) for r in (1, 4, 8, 12)]
    ttfts = [o.ttft_p95 for o in outcomes]
    itls = [o.itl_p95 for o in outcomes]
    assert ttfts == sorted(ttfts) and itls == sorted(itls)
    assert [o.utilisation for o in outcomes] == sorted(o.utilisation for o in outcomes)
    assert not outcomes[0].saturated
    over = simulate(CURVE, Load(2 * bound, 128, 32))
    assert over.saturated and over.ttft_p95 > 10 * outcomes[0].ttft_p95


def test_seats_are_what_the_kv_cache_holds_when_that_is_fewer():
    small = LoadCurve.from_dict(curve_dict(kv_cache_tokens=160 * 3 + 10))
    assert simulate(small, Load(1, 128, 32)).seats == 3
    assert simulate(CURVE, Load(1, 128, 32)).seats == 16


def test_the_simulation_is_reproducible_and_seeded():
    a = simulate(CURVE, Load(6, 128, 32), seed=3)
    assert a == simulate(CURVE, Load(6, 128, 32), seed=3)
    assert a != simulate(CURVE, Load(6, 128, 32), seed=4)


def test_the_plan_holds_the_targets_and_one_replica_fewer_does_not():
    targets = Targets(ttft_seconds=0.3, itl_seconds=0.04)
    plan = plan_replicas(CURVE, rps=30, prompt_tokens=128, output_tokens=32, targets=targets,
                         hourly_rate=Decimal("2.40"), currency="usd")
    assert plan.replicas >= 2
    assert targets.met(plan.at_plan) and not targets.met(plan.one_fewer)
    assert plan.replicas == math.ceil(30 / plan.replica_rps) or plan.replicas == math.ceil(30 / plan.replica_rps) + 1
    # Money: the fleet's hour over the hour's tokens, in Decimal.
    assert plan.hourly_cost == Decimal("2.40") * plan.replicas
    tokens_per_hour = Decimal(30 * 3600 * 160)
    assert plan.cost_per_million_tokens == (plan.hourly_cost * 1_000_000 / tokens_per_hour).quantize(Decimal("0.000001"))
    assert plan.cost_per_thousand_requests == (plan.hourly_cost * 1000 / Decimal(30 * 3600)).quantize(
        Decimal("0.000001"))
    # Half the load needs no more replicas; an unrated class has no cost.
    half = plan_replicas(CURVE, rps=15, prompt_tokens=128, output_tokens=32, targets=targets)
    assert half.replicas <= plan.replicas and half.hourly_cost is None and half.cost_per_million_tokens is None


def test_capacity_is_the_rate_at_the_edge_of_the_targets():
    targets = Targets(ttft_seconds=0.3, itl_seconds=0.04)
    capacity = replica_capacity(CURVE, 128, 32, targets)
    assert targets.met(simulate(CURVE, Load(capacity, 128, 32)))
    assert not targets.met(simulate(CURVE, Load(capacity * 1.1, 128, 32)))


def test_targets_no_load_can_meet_are_a_clear_error():
    with pytest.raises(PlanError, match="one request alone has TTFT"):
        plan_replicas(CURVE, rps=1, prompt_tokens=512, output_tokens=8, targets=Targets(0.05, 1.0))
    with pytest.raises(PlanError, match="does not fit"):
        plan_replicas(CURVE, rps=1, prompt_tokens=30000, output_tokens=8, targets=Targets(10, 1.0))
    for rps in (0, -1, float("nan"), float("inf")):
        with pytest.raises(PlanError, match="rps"):
            plan_replicas(CURVE, rps=rps, prompt_tokens=8, output_tokens=8, targets=Targets(10, 1.0))
