"""A chunk dropped by a preemption in the step that scheduled it leaves nothing in the prefix cache.

Blocks are published when allocated (scheduler + KV manager, no model): the running request's chunk
publishes its full blocks, then a waiting request that outranks it preempts it in the same step and
the chunk is never computed. Those blocks must not be found by the next request with the same prefix
(before the fix they were, and it attended to K/V nobody wrote: tests/dataplane/test_embeddings.py
shows the wrong vectors that came out)."""

from __future__ import annotations

from tests.dataplane.helpers import make_request, make_scheduler, run_step


def test_blocks_of_a_dropped_chunk_are_not_hits():
    sched = make_scheduler(max_num_seqs=1, max_num_batched_tokens=12)
    low = make_request("low", prompt_len=23, max_tokens=1, priority=5)
    sched.add_request(low)
    run_step(sched)  # tokens 0..11 computed: blocks 0-2 full
    sched.add_request(make_request("high", prompt_len=2, priority=0, first_token=500))
    out, _ = run_step(sched)  # low's chunk (11 tokens, publishing blocks 3 and 4) is scheduled, then dropped
    assert out.preempted_request_ids == ["low"] and "low" not in out.num_scheduled_tokens
    hits, n = sched.kv.get_computed_blocks(make_request("probe", prompt_len=23))  # the same tokens
    assert n == 12 and len(hits) == 3  # what was computed, not the 20 tokens published


def test_a_preemption_between_chunks_keeps_every_computed_block():
    sched = make_scheduler(max_num_seqs=1, max_num_batched_tokens=8)
    sched.add_request(make_request("low", prompt_len=23, max_tokens=1, priority=5))
    run_step(sched)
    run_step(sched)  # 16 tokens computed; the budget is spent, so nothing is dropped mid-step
    hits, n = sched.kv.get_computed_blocks(make_request("probe", prompt_len=23))
    assert n == 16 and len(hits) == 4


def test_a_request_that_preempts_the_filler_of_its_hits_looks_them_up_again():
    """Y hits blocks X publishes in this very step, then needs blocks and preempts X: X's chunk is
    dropped, so Y must not keep those blocks as computed (it would attend to K/V nobody wrote)."""
    sched = make_scheduler(num_blocks=7, max_num_batched_tokens=16)
    sched.add_request(make_request("x", prompt_len=16, max_tokens=1, priority=5))  # tokens 100..115
    sched.add_request(make_request("z", prompt_len=8, max_tokens=4, priority=3, first_token=300))
    run_step(sched)  # z's prompt, x's first 8 tokens
    sched.add_request(make_request("y", prompt_len=20, max_tokens=1, priority=0))  # x's 16 tokens + 4
    out, _ = run_step(sched)  # x's chunk publishes its blocks 2-3; y hits them, is short, preempts x (and z)
    assert "x" in out.preempted_request_ids
    new = next(r for r in out.new_requests if r.request_id == "y")
    assert new.num_computed_tokens == 8 and out.num_scheduled_tokens["y"] == 12  # only x's computed blocks
