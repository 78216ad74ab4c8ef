"""The autoscaler's pure decision (controlplane/deployments/autoscale/policy.py): no database, no clock."""

from __future__ import annotations

import itertools
import random

import pytest

from controlplane.deployments.autoscale.policy import (
    DOWN_REASONS,
    HOLD_REASONS,
    UP_REASONS,
    History,
    Policy,
    Signals,
    decide,
)

P = Policy(min_replicas=1, max_replicas=8)  # defaults: target 4 waiting, cooldowns 30 s up / 300 s down
T0 = 1_000_000.0


def sig(current: int = 2, *, now: float = T0, ready: int | None = None, reporting: int | None = None,
        **load) -> Signals:
    ready = current if ready is None else ready
    return Signals(now=now, current=current, ready=ready, reporting=ready if reporting is None else reporting,
                   **{"kv_usage_max": 0.1, "kv_usage_mean": 0.1, **load})


def quiet(current: int = 2, **kw) -> Signals:
    return sig(current, **{"running": 0, "waiting": 0, "kv_usage_max": 0.05, "kv_usage_mean": 0.05,
                           "recent_requests": 0, **kw})


# --- up -------------------------------------------------------------------------------------------

def test_queue_above_target_scales_up_in_proportion_at_most_doubling():
    d = decide(sig(2, waiting=20), P, History())  # 10 per replica vs 4: ceil(2 x 10 / 4) = 5, capped at 4
    assert (d.desired, d.reason, d.direction) == (4, "queue", "up")
    assert decide(sig(2, waiting=10), P, History()).desired == 3  # 5 per replica: ceil(2.5) = 3
    assert decide(sig(2, waiting=8), P, History()).desired == 2  # exactly at target: no change (strictly above)


def test_kv_cache_and_burn_each_add_one_and_the_largest_want_wins():
    assert decide(sig(2, kv_usage_max=0.9), P, History()).desired == 3
    d = decide(sig(2, fast_burn=20.0), P, History())
    assert (d.desired, d.reason) == (3, "slo_burn") and "20.0" in d.detail
    assert decide(sig(2, fast_burn=14.4), P, History()).direction == "hold"  # not above the page factor
    d = decide(sig(2, waiting=40, kv_usage_max=0.95, fast_burn=30.0), P, History())
    assert (d.desired, d.reason) == (4, "queue")


def test_up_is_capped_at_max_and_holds_there():
    assert decide(sig(6, waiting=200), P, History()).desired == 8
    d = decide(sig(8, waiting=200), P, History())
    assert (d.desired, d.reason) == (8, "at_max")


def test_up_cooldown_then_up_again():
    h = History(last_up_at=T0 - 10)
    assert decide(sig(2, waiting=40), P, h).reason == "up_cooldown"
    assert decide(sig(2, waiting=40, now=T0 + 20), P, h).desired == 4


def test_up_uses_the_reporting_replicas_even_when_one_is_silent():
    d = decide(sig(3, reporting=2, waiting=20), P, History())  # 10 per reporting replica
    assert d.direction == "up"


# --- bounds ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("low,high,current,want", [(2, 5, 0, 2), (2, 5, 1, 2), (1, 3, 7, 3), (0, 1, 2, 1)])
def test_bounds_apply_at_once_whatever_the_cooldowns(low, high, current, want):
    h = History(last_up_at=T0, last_down_at=T0)
    d = decide(quiet(current), Policy(min_replicas=low, max_replicas=high), h)
    assert d.desired == want and d.reason in ("below_min", "above_max")


def test_never_below_min_never_above_max_over_random_signals():
    rng = random.Random(29)
    for _ in range(3000):
        low = rng.randint(0, 3)
        p = Policy(min_replicas=low, max_replicas=rng.randint(max(low, 1), 6))
        current = rng.randint(p.min_replicas, p.max_replicas)
        ready = rng.randint(0, current)
        s = Signals(now=T0, current=current, ready=ready, reporting=rng.randint(0, ready),
                    running=rng.randint(0, 50), waiting=rng.randint(0, 80), seats=rng.choice([0, 64]),
                    kv_usage_max=rng.choice([None, rng.random()]), kv_usage_mean=rng.choice([None, rng.random() / 2]),
                    fast_burn=rng.choice([None, rng.random() * 30]), recent_requests=rng.choice([0, 5]))
        h = History(*(rng.choice([None, T0 - rng.randint(0, 1000)]) for _ in range(3)))
        d = decide(s, p, h)
        assert p.min_replicas <= d.desired <= p.max_replicas
        assert d.reason in UP_REASONS + DOWN_REASONS + HOLD_REASONS
        assert d.current - d.desired <= 1  # down one at a time
        if d.desired < d.current:
            assert s.reporting == s.ready > 0  # never down on a partial view
            assert d.desired > 0 or (s.recent_requests == 0 and s.running == 0 and s.waiting == 0)


def test_policy_refuses_max_below_min():
    with pytest.raises(ValueError, match="min_replicas/max_replicas"):
        Policy(min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError):
        Policy(min_replicas=0, max_replicas=0)


# --- down, slowly ---------------------------------------------------------------------------------

def test_down_needs_a_stable_low_window_then_one_step():
    d = decide(quiet(3), P, History())
    assert (d.reason, d.low_since) == ("stabilising", T0)
    d = decide(quiet(3, now=T0 + 299), P, History(low_since=T0))
    assert d.reason == "stabilising"
    d = decide(quiet(3, now=T0 + 300), P, History(low_since=T0))
    assert (d.desired, d.reason, d.low_since) == (2, "low_load", None)  # the next step waits a full window again


def test_down_cooldown_after_any_change():
    h = History(last_up_at=T0 + 200, low_since=T0)
    assert decide(quiet(3, now=T0 + 400), P, h).reason == "down_cooldown"
    assert decide(quiet(3, now=T0 + 500), P, h).desired == 2


def test_band_between_thresholds_holds_and_restarts_the_clock():
    d = decide(sig(2, waiting=4, now=T0 + 1000), P, History(low_since=T0))  # 2 per replica on 1: above 0.5
    assert (d.reason, d.low_since) == ("steady", None)


def test_projection_onto_one_fewer_replica_blocks_the_down():
    # 2 replicas at 40% KV each would be 80% on one: above kv_low
    assert decide(sig(2, kv_usage_mean=0.4, kv_usage_max=0.4, now=T0 + 1000), P, History(low_since=T0)).reason == "steady"
    # 40 requests on 2 x 32 seats: 40 > 50% of one replica's 32
    d = decide(sig(2, running=40, seats=64, now=T0 + 1000), P, History(low_since=T0))
    assert d.reason == "steady" and "seats" in d.detail
    assert decide(sig(2, running=10, seats=64, now=T0 + 1000), P, History(low_since=T0)).desired == 1


def test_burn_above_low_blocks_the_down():
    assert decide(quiet(3, fast_burn=2.0, now=T0 + 1000), P, History(low_since=T0)).reason == "steady"


def test_at_min_holds():
    assert decide(quiet(1, now=T0 + 1000), P, History(low_since=T0)).reason == "at_min"


# --- hysteresis against flapping signals -----------------------------------------------------------

@pytest.mark.parametrize("pattern", [("high", "low"), ("band", "low"), ("high", "band", "low", "low")])
def test_flapping_signals_never_scale_down_and_up_at_most_once_per_cooldown(pattern):
    readings = {"high": dict(waiting=5), "band": dict(waiting=1), "low": dict(waiting=0)}
    p = Policy(min_replicas=1, max_replicas=50)
    current, h, changes = 3, History(), []
    for step, kind in zip(range(720), itertools.cycle(pattern), strict=False):  # an hour, a pass every 5 s
        now = T0 + 5 * step
        s = Signals(now=now, current=current, ready=current, reporting=current, kv_usage_max=0.1, kv_usage_mean=0.1,
                    waiting=readings[kind]["waiting"] * current)
        d = decide(s, p, h)
        h = History(now if d.direction == "up" else h.last_up_at, now if d.direction == "down" else h.last_down_at,
                    d.low_since)
        if d.direction != "hold":
            changes.append((now, d.direction))
        current = d.desired
    assert all(direction == "up" for _, direction in changes)
    assert all(b - a >= p.up_cooldown for (a, _), (b, _) in itertools.pairwise(changes))


def test_steady_low_load_steps_down_once_per_window_to_min():
    current, h, downs = 5, History(), []
    for step in range(400):
        now = T0 + 5 * step
        d = decide(quiet(current, now=now), P, h)
        h = History(h.last_up_at, now if d.direction == "down" else h.last_down_at, d.low_since)
        if d.direction == "down":
            downs.append(now)
        current = d.desired
    assert current == 1 and len(downs) == 4
    assert all(b - a >= 300 for a, b in itertools.pairwise(downs))


# --- missing signals and scale to zero ------------------------------------------------------------

def test_a_silent_worker_blocks_any_down_even_to_zero():
    p = Policy(min_replicas=0, max_replicas=4)
    h = History(low_since=T0 - 10_000)
    d = decide(quiet(2, reporting=1, now=T0), p, h)
    assert (d.desired, d.reason, d.low_since) == (2, "signals_missing", None)
    d = decide(quiet(1, reporting=0, now=T0), p, h)  # the only worker stopped reporting: it may be busy
    assert (d.desired, d.reason) == (1, "signals_missing")


def test_no_ready_replica_holds():
    assert decide(quiet(2, ready=0), P, History()).reason == "not_ready"


def test_to_zero_only_after_no_request_at_all():
    p = Policy(min_replicas=0, max_replicas=4)
    h = History(low_since=T0 - 1000)
    assert decide(quiet(1, recent_requests=3), p, h).reason == "steady"
    assert decide(sig(1, running=1, waiting=0, kv_usage_mean=0.0, recent_requests=0), p, h).reason == "steady"
    d = decide(quiet(1), p, h)
    assert (d.desired, d.reason) == (0, "idle")


def test_at_zero_holds_the_gateway_wakes_it():
    p = Policy(min_replicas=0, max_replicas=4)
    d = decide(Signals(now=T0, current=0, ready=0, reporting=0), p, History())
    assert (d.desired, d.reason) == (0, "scaled_to_zero")
