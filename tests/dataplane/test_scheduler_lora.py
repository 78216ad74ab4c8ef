"""The scheduler's max_loras constraint and its fairness across adapters, with no model."""

from __future__ import annotations

import random

from dataplane.config import SchedulerConfig
from dataplane.kv_cache.manager import KVCacheManager
from dataplane.scheduler.scheduler import Scheduler
from tests.dataplane.helpers import FakeClock, assert_no_leaks, make_request, run_step


def make(max_loras: int, num_blocks: int = 256, **cfg) -> Scheduler:
    config = SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 64, **cfg})
    return Scheduler(config, KVCacheManager(num_blocks, 4, True), 1024, clock=FakeClock(), max_loras=max_loras)


def running_adapters(s: Scheduler) -> set[str]:
    return {r.adapter for r in s.running if r.adapter is not None}


def test_at_most_max_loras_adapters_run_and_base_requests_are_not_held_back():
    s = make(max_loras=2)
    for rid, adapter in (("a", "A"), ("b", "B"), ("c", "C"), ("base", None), ("a2", "A")):
        s.add_request(make_request(rid, adapter=adapter, max_tokens=3))
    out, _ = run_step(s)
    # C has no slot; the rest go ahead. B (nothing waiting for it) is retired so that C gets its slot.
    assert set(out.num_scheduled_tokens) == {"a", "b", "base", "a2"}
    assert s._lora_retiring == {"B"}
    assert {n.request_id: n.adapter for n in out.new_requests}["a2"] == "A"
    while "c" not in {r.request_id for r in s.running}:
        run_step(s)
        assert len(running_adapters(s)) <= 2
    while s.has_unfinished():
        run_step(s)
    assert_no_leaks(s)


def test_a_rare_adapter_is_not_starved_by_popular_ones():
    """Two popular adapters always have requests arriving; a rare one must still get a slot soon."""
    s = make(max_loras=2, max_num_seqs=6)
    n = 0

    def arrive(adapter: str) -> None:
        nonlocal n
        n += 1
        s.add_request(make_request(f"{adapter}{n}", adapter=adapter, max_tokens=4))

    for _ in range(3):
        arrive("popular-1")
        arrive("popular-2")
    run_step(s)
    arrive("rare")
    rare = s.requests[f"rare{n}"]
    for step in range(40):
        arrive("popular-1" if step % 2 else "popular-2")  # a steady stream that would keep both slots busy
        run_step(s)
        assert len(running_adapters(s)) <= 2
        if rare.status.finished:
            break
    assert rare.status.finished, "the rare adapter's request never ran"
    assert step < 12  # about one request lifetime (prompt + 4 tokens) to drain a retired adapter
    # The retired popular adapter comes back: nobody is starved in turn.
    for _ in range(60):
        if not s.has_unfinished():
            break
        run_step(s)
    assert not s.has_unfinished()
    assert_no_leaks(s)


def test_the_retired_adapter_is_the_one_that_drains_soonest():
    s = make(max_loras=2, max_num_seqs=8)
    for i in range(3):
        s.add_request(make_request(f"big{i}", adapter="BIG", max_tokens=40))
    s.add_request(make_request("small", adapter="SMALL", max_tokens=20))
    run_step(s)
    s.add_request(make_request("new", adapter="NEW", max_tokens=2))
    s.add_request(make_request("big-late", adapter="BIG", max_tokens=2))
    s.add_request(make_request("small-late", adapter="SMALL", max_tokens=2))
    out, _ = run_step(s)
    # SMALL (one running request) is retired: its new request waits, BIG keeps admitting.
    assert "big-late" in out.num_scheduled_tokens and "small-late" not in out.num_scheduled_tokens
    assert s._lora_retiring == {"SMALL"}
    while "new" not in {r.request_id for r in s.running} and s.has_unfinished():
        run_step(s)
    assert "SMALL" not in running_adapters(s) and "NEW" in running_adapters(s)


def test_random_workload_respects_the_limit_and_finishes_everything():
    rng = random.Random(7)
    s = make(max_loras=3, num_blocks=64, max_num_seqs=6, max_num_batched_tokens=32)
    names = [f"a{i}" for i in range(6)] + [None]
    weights = [40, 20, 10, 5, 2, 1, 15]  # skewed popularity
    pending = 120
    steps = 0
    while pending or s.has_unfinished():
        for _ in range(rng.randint(0, 2)):
            if pending:
                adapter = rng.choices(names, weights)[0]
                s.add_request(make_request(f"r{pending}", prompt_len=rng.randint(1, 20),
                                           max_tokens=rng.randint(1, 8), adapter=adapter))
                pending -= 1
        run_step(s)
        assert len(running_adapters(s)) <= 3
        steps += 1
        assert steps < 3000
    assert_no_leaks(s)


def test_without_max_loras_nothing_changes():
    s = make(max_loras=None)  # type: ignore[arg-type]
    for i in range(5):
        s.add_request(make_request(f"r{i}", adapter=f"A{i}"))
    out, _ = run_step(s)
    assert len(out.num_scheduled_tokens) == 5
