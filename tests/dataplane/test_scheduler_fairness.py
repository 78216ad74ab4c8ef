"""Fair sharing between tenants of one priority (scheduler/fairness.py, VTC), with no model."""

from __future__ import annotations

import random

import pytest

from dataplane.config import SchedulerConfig
from dataplane.request import RequestStatus
from dataplane.scheduler.fairness import VirtualTokenCounter, assign_tenant
from dataplane.scheduler.scheduler import Scheduler

from .helpers import FakeClock, assert_no_leaks, make_request, make_scheduler, run_step

PROMPT, MAX_TOKENS, SEATS = 8, 8, 4
# One request's charge at most: w_p * prompt + w_q * output, the paper's weights (1, 2).
U = 1 * PROMPT + 2 * MAX_TOKENS
# Admission always goes to the least-served tenant, so a leader gets no new seat while it leads: its
# lead grows only through the requests it already runs, at most SEATS of them, each charged <= U.
LAG_BOUND = SEATS * U


def add(sched, clock, tenant: str, n: int, *, start: int = 0, weight: float = 1.0, priority: int = 0,
        prompt: int = PROMPT, max_tokens: int = MAX_TOKENS) -> None:
    for i in range(start, start + n):
        # Per-tenant salts as the gateway sets them: tenants never share prefix-cache blocks.
        req = make_request(f"{tenant}-{i}", prompt_len=prompt, max_tokens=max_tokens, priority=priority,
                           clock=clock, first_token=100 + i, cache_salt=tenant)
        assign_tenant([req], tenant, weight)
        sched.add_request(req)


def drive(sched, clock, steps: int | None = None, dt: float = 0.05):
    """Run steps (all, or `steps`); yield (step, admitted request ids, finished ids) per step."""
    step = 0
    while sched.has_unfinished() and (steps is None or step < steps):
        out, outs = run_step(sched)
        clock.now += dt
        yield step, [r.request_id for r in out.new_requests], [o.request_id for o in outs if o.finish_reason]
        step += 1


def backlogged(sched, tenant: str) -> bool:
    return any(r.tenant == tenant for r in sched.waiting)


@pytest.mark.parametrize("fair", [True, False])
def test_a_flood_does_not_starve_a_small_tenant_of_the_same_tier(fair):
    clock = FakeClock()
    sched = make_scheduler(num_blocks=256, clock=clock, max_num_seqs=SEATS, fair_share=fair)
    add(sched, clock, "big", 200)
    list(drive(sched, clock, steps=5))
    add(sched, clock, "small", 2)
    admitted, finished = {}, {}
    for step, new, done in drive(sched, clock):
        admitted.update({rid: step for rid in new if rid.startswith("small")})
        finished.update({rid: step for rid in done if rid.startswith("small")})
    assert_no_leaks(sched)
    # A request's life: one prefill step and MAX_TOKENS - 1 decodes. From the step after its arrival the
    # small tenant is the least served (lifted to the big one's counter, which grows with every decode),
    # so the first seats that free are its: within one request life of the big tenant's.
    life = MAX_TOKENS
    if fair:
        assert max(admitted.values()) <= life, admitted
        assert max(finished.values()) <= 2 * life, finished
    else:  # first come, first served: behind the whole flood
        assert min(admitted.values()) > 150 * life // SEATS, admitted


@pytest.mark.parametrize("weights", [(1, 1), (2, 1)])
def test_backlogged_tenants_share_by_weight_within_a_bounded_lag(weights):
    clock = FakeClock()
    sched = make_scheduler(num_blocks=512, clock=clock, max_num_seqs=SEATS)
    add(sched, clock, "a", 150, weight=weights[0])
    add(sched, clock, "b", 150, weight=weights[1])
    worst_lag = 0.0
    for _ in drive(sched, clock, steps=200):
        assert backlogged(sched, "a") and backlogged(sched, "b")  # saturated all along
        c = sched.fair.counters
        worst_lag = max(worst_lag, abs(c["a"] - c["b"]))
    assert worst_lag <= LAG_BOUND
    # counters are service over weight: times the weight, the tokens each got (prompt + 2 x output)
    served = {t: sched.fair.counters[t] * w for t, w in zip("ab", weights, strict=True)}
    ratio = served["a"] / served["b"]
    want = weights[0] / weights[1]
    assert want * 0.9 <= ratio <= want * 1.1, (ratio, served)


def test_unequal_requests_keep_the_lag_bounded():
    """Random prompt and output lengths: service, not request counts, is what evens out."""
    clock = FakeClock()
    sched = make_scheduler(num_blocks=512, clock=clock, max_num_seqs=SEATS)
    rng = random.Random(7)
    for i in range(120):
        for tenant in ("a", "b"):
            add(sched, clock, tenant, 1, start=i, prompt=rng.randint(1, PROMPT), max_tokens=rng.randint(1, MAX_TOKENS))
    worst = 0.0
    for _ in drive(sched, clock):
        if backlogged(sched, "a") and backlogged(sched, "b"):
            worst = max(worst, abs(sched.fair.counters["a"] - sched.fair.counters["b"]))
    assert 0 < worst <= LAG_BOUND
    assert_no_leaks(sched)


def test_priority_wins_over_fairness():
    clock = FakeClock()
    sched = make_scheduler(num_blocks=256, clock=clock, max_num_seqs=2)
    add(sched, clock, "heavy", 30)
    list(drive(sched, clock, steps=40))  # heavy is now far ahead in service
    add(sched, clock, "light", 6, priority=5)  # never served, but a lower tier
    order = [rid for _, new, _ in drive(sched, clock) for rid in new]
    assert [rid.split("-")[0] for rid in order] == ["heavy"] * (len(order) - 6) + ["light"] * 6


def test_fairness_never_moves_a_tiers_slots_under_aging():
    """Which tier gets each seat is exactly what priority + aging decide without fairness."""
    def tiers_admitted(fair: bool) -> list[int]:
        clock = FakeClock()
        sched = make_scheduler(num_blocks=512, clock=clock, max_num_seqs=3, aging_seconds=0.5, fair_share=fair)
        add(sched, clock, "old", 12, priority=3)  # a lower tier that ages past newer arrivals
        list(drive(sched, clock, steps=3))
        clock.now += 1.2
        add(sched, clock, "x", 10, start=100, priority=1)
        add(sched, clock, "y", 3, start=200, priority=1)
        add(sched, clock, "z", 5, start=300, priority=3)
        prio = {r.request_id: r.priority for r in list(sched.waiting) + list(sched.running)}
        seen = [prio[rid] for _, new, _ in drive(sched, clock) for rid in new]
        assert_no_leaks(sched)
        return seen, sched.num_preemptions

    (fair, fair_preempted), (fcfs, fcfs_preempted) = tiers_admitted(True), tiers_admitted(False)
    assert fair == fcfs and fair_preempted == fcfs_preempted
    assert fair.index(3) < len(fair) - fair[::-1].index(1) - 1  # aging put some of tier 3 before tier 1


def test_a_returning_idle_tenant_gets_no_burst_beyond_the_lift():
    clock = FakeClock()
    sched = make_scheduler(num_blocks=512, clock=clock, max_num_seqs=SEATS)
    add(sched, clock, "b", 1)
    add(sched, clock, "a", 200)
    for _, _, done in drive(sched, clock):
        if "b-0" in done:
            stale = sched.fair.counters["b"]  # b's service when it went idle
            break
    list(drive(sched, clock, steps=120))  # a kept being served
    a_before = sched.fair.counters["a"]
    assert a_before - stale > 10 * LAG_BOUND  # what b would burst by if idle time were banked
    add(sched, clock, "b", 100, start=1)
    list(drive(sched, clock, steps=1))
    assert sched.fair.counters["b"] >= a_before  # lifted to the active minimum on arrival
    worst = 0.0
    for _ in drive(sched, clock, steps=100):
        if backlogged(sched, "a") and backlogged(sched, "b"):
            worst = max(worst, sched.fair.counters["b"] - sched.fair.counters["a"],
                        sched.fair.counters["a"] - sched.fair.counters["b"])
    assert worst <= LAG_BOUND


def test_idle_tenants_are_forgotten_and_the_rest_capped():
    clock = FakeClock()
    sched = make_scheduler(num_blocks=512, clock=clock, max_num_seqs=8)
    for t in range(300):  # one-off tenants, a few at a time
        add(sched, clock, f"t{t}", 1)
        if t % 3 == 2:
            list(drive(sched, clock))
    list(drive(sched, clock))
    assert_no_leaks(sched)
    add(sched, clock, "last", 1)
    list(drive(sched, clock))
    assert len(sched.fair.counters) <= 2  # at or below the floor: nothing to remember

    # Over-served tenants that left while a slow one stayed are kept (they must not erase it by leaving)
    # up to max_idle, the most over-served kept.
    sched.fair.max_idle = 2
    add(sched, clock, "steady", 1, prompt=2, max_tokens=60)
    list(drive(sched, clock, steps=1))
    for t, prompt in enumerate((10, 40, 30, 20)):
        add(sched, clock, f"burst{t}", 1, prompt=prompt, max_tokens=2)
    list(drive(sched, clock, steps=10))
    assert sched.requests.keys() == {"steady-0"}
    list(drive(sched, clock, steps=1))  # the next step sees them gone
    assert set(sched.fair.counters) == {"steady", "burst1", "burst2"}
    list(drive(sched, clock))
    assert_no_leaks(sched)


def test_one_tenant_is_first_come_first_served():
    orders = []
    for fair in (True, False):
        clock = FakeClock()
        sched = make_scheduler(num_blocks=256, clock=clock, max_num_seqs=3, aging_seconds=0.3, fair_share=fair)
        for i in range(12):
            add(sched, clock, "only", 1, start=i, priority=i % 3, prompt=3 + i % 5)
            clock.now += 0.1
        orders.append([rid for _, new, _ in drive(sched, clock) for rid in new])
    assert orders[0] == orders[1]


def test_bad_weights_are_refused_naming_the_field():
    req = make_request("r")
    for bad in (0, -1, float("nan"), float("inf"), 1e6):
        with pytest.raises(ValueError, match="tenant_weight"):
            assign_tenant([req], "t", bad)
    with pytest.raises(ValueError, match="fair_share_output_weight"):
        SchedulerConfig(fair_share_input_weight=0, fair_share_output_weight=0)
    with pytest.raises(ValueError, match="fair_share_input_weight"):
        SchedulerConfig(fair_share_input_weight=-1)
    assert VirtualTokenCounter().counter(None) == 0.0  # the anonymous bucket


def test_one_steps_admissions_alternate_between_tenants():
    """Within a step a tenant's counter is projected by the prompts it was just given, so one step does
    not hand every free seat to whoever was least served at its start."""
    clock = FakeClock()
    sched = make_scheduler(num_blocks=256, clock=clock, max_num_seqs=6)
    add(sched, clock, "a", 5)
    add(sched, clock, "b", 5)
    (_, new, _), = drive(sched, clock, steps=1)
    assert [rid.split("-")[0] for rid in new] == ["a", "b"] * 3



class _ObservesEveryStep(Scheduler):
    def _admit_waiting(self, out, budget, now, rank):  # noqa: ANN001, ANN202
        if not self.waiting:
            self.fair.observe(self.running)  # as the scheduler did before: every step (twice is once)
        return super()._admit_waiting(out, budget, now, rank)


@pytest.mark.parametrize("seed", range(6))
def test_observing_only_when_requests_left_changes_nothing(seed):
    """With nobody waiting, the counter observes the running requests only when their count fell since it
    last looked (scheduler._admit_waiting). A twin that observes every step, fed the same arrivals,
    aborts and finishes of several tenants in lockstep, admits in the same order, and its counters and
    active tenants, and its floor whenever an arrival reads it, are the same at every step."""
    clock = FakeClock()
    every, lazy = (make_scheduler(num_blocks=256, clock=clock, max_num_seqs=3, fair_share=True) for _ in range(2))
    every.__class__ = _ObservesEveryStep
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    admitted = 0
    for step in range(200):
        if step < 160 and rng.random() < 0.12:
            tenant, n = rng.choice("abcd"), rng.randint(1, 3)
            for sched in (every, lazy):
                add(sched, clock, tenant, n, start=seen.get(tenant, 0), max_tokens=4 + step % 7)
            seen[tenant] = seen.get(tenant, 0) + n
        if rng.random() < 0.05 and lazy.running:
            victim = lazy.running[step % len(lazy.running)].request_id
            for sched in (every, lazy):
                sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
        waiting = bool(lazy.waiting)
        outs = [run_step(sched)[0] for sched in (every, lazy)]
        clock.now += 0.05
        assert [r.request_id for r in outs[0].new_requests] == [r.request_id for r in outs[1].new_requests]
        admitted += len(outs[1].new_requests)
        assert (every.fair.counters, every.fair.active) == (lazy.fair.counters, lazy.fair.active), f"step {step}"
        if waiting:
            assert every.fair.floor == lazy.fair.floor, f"step {step}"
    assert admitted > 20 and not lazy.has_unfinished()
    assert_no_leaks(lazy)
