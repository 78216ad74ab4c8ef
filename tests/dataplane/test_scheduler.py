"""Scheduler with no model: budgets, chunked prefill, priorities, aging, preemption, leaks."""

import pytest

from dataplane.errors import QueueFullError
from dataplane.request import RequestStatus
from dataplane.scheduler.output import ModelRunnerOutput
from tests.dataplane.helpers import EOS, FakeClock, assert_no_leaks, make_request, make_scheduler, run_step


def drain(sched, limit=500, token=7):
    outputs = []
    for _ in range(limit):
        if not sched.has_unfinished():
            return outputs
        out, core = run_step(sched, token)
        assert out.total_num_scheduled_tokens <= sched.config.max_num_batched_tokens
        assert len(sched.running) <= sched.config.max_num_seqs
        outputs.append((out, core))
    raise AssertionError("scheduler did not finish")


def test_budget_respected_and_long_prompts_are_chunked():
    sched = make_scheduler(max_num_batched_tokens=32)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", prompt_len=50, max_tokens=3, first_token=100 * i))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"r0": 32}
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"r0": 18, "r1": 14}
    steps = drain(sched)
    assert all(o.total_num_scheduled_tokens <= 32 for o, _ in steps)
    assert_no_leaks(sched)


def test_decodes_and_a_prefill_chunk_share_one_step():
    sched = make_scheduler(max_num_batched_tokens=16)
    sched.add_request(make_request("a", prompt_len=4, max_tokens=10))
    run_step(sched)  # a's prompt, first token
    sched.add_request(make_request("b", prompt_len=40, max_tokens=2, first_token=500))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 15}
    assert [n.request_id for n in out.new_requests] == ["b"]
    assert [c.request_id for c in out.cached_requests] == ["a"]


def test_max_num_seqs_caps_running():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(4):
        sched.add_request(make_request(f"r{i}", first_token=100 * i))
    out, _ = run_step(sched)
    assert set(out.num_scheduled_tokens) == {"r0", "r1"}
    drain(sched)
    assert_no_leaks(sched)


def test_lower_priority_value_runs_first_fcfs_within_priority():
    sched = make_scheduler(max_num_seqs=2)
    sched.add_request(make_request("low", priority=5))
    sched.add_request(make_request("hi-1", priority=0, first_token=300))
    sched.add_request(make_request("hi-2", priority=0, first_token=400))
    out, _ = run_step(sched)
    assert [n.request_id for n in out.new_requests] == ["hi-1", "hi-2"]


def test_aging_lets_a_long_waiting_request_overtake():
    clock = FakeClock()
    sched = make_scheduler(max_num_seqs=1, clock=clock, aging_seconds=1.0)
    sched.add_request(make_request("old-low", priority=3, clock=clock))
    clock.now += 10  # waited 10 s: effective priority 3 - 10 = -7
    sched.add_request(make_request("new-high", priority=0, clock=clock, first_token=300))
    out, _ = run_step(sched)
    assert list(out.num_scheduled_tokens) == ["old-low"]


def test_out_of_blocks_preempts_lowest_priority_latest_and_resumes_it():
    # 6 blocks of 4 tokens; two requests of 8 prompt tokens growing to 8 + 12 = 20 tokens (5 blocks each).
    sched = make_scheduler(num_blocks=6, block_size=4)
    sched.add_request(make_request("first", prompt_len=8, max_tokens=12))
    sched.add_request(make_request("second", prompt_len=8, max_tokens=12, first_token=300))
    steps = drain(sched)
    preempted = [rid for o, _ in steps for rid in o.preempted_request_ids]
    assert preempted and set(preempted) == {"second"}
    finished = {c.request_id: c for _, cores in steps for c in cores if c.finish_reason}
    assert set(finished) == {"first", "second"} and all(c.finish_reason == "length" for c in finished.values())
    assert sched.num_preemptions == len(preempted)
    assert_no_leaks(sched)


def test_resumed_request_recomputes_prompt_and_outputs():
    sched = make_scheduler(num_blocks=6, block_size=4)
    a = make_request("a", prompt_len=8, max_tokens=12)
    b = make_request("b", prompt_len=8, max_tokens=12, first_token=300)
    sched.add_request(a)
    sched.add_request(b)
    resumed = None
    for _ in range(200):
        out, _ = run_step(sched)
        resumed = next((n for n in out.new_requests if n.request_id == "b" and len(n.token_ids) > 8), resumed)
        if not sched.has_unfinished():
            break
    assert resumed is not None, "b was never resumed after preemption"
    assert resumed.token_ids[:8] == b.prompt_token_ids and resumed.num_prompt_tokens == 8
    assert b.num_output_tokens == 12


def test_high_priority_arrival_preempts_lower_priority_running():
    sched = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("batch", priority=10, max_tokens=50))
    run_step(sched)
    sched.add_request(make_request("urgent", priority=0, first_token=300))
    out, _ = run_step(sched)
    assert out.preempted_request_ids == ["batch"]
    assert list(out.num_scheduled_tokens) == ["urgent"]
    # An equal-priority arrival never preempts.
    sched2 = make_scheduler(max_num_seqs=1)
    sched2.add_request(make_request("x", priority=1, max_tokens=50))
    run_step(sched2)
    sched2.add_request(make_request("y", priority=1, first_token=300))
    out, _ = run_step(sched2)
    assert out.preempted_request_ids == [] and list(out.num_scheduled_tokens) == ["x"]


def test_admission_refuses_what_can_never_fit():
    sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="maximum context length"):
        sched.add_request(make_request("long", prompt_len=60, max_tokens=10))
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add_request(make_request("big", prompt_len=16, max_tokens=4))
    with pytest.raises(ValueError, match="prompt"):
        sched.add_request(make_request("empty", prompt_len=0))
    assert not sched.has_unfinished() and sched.kv.pool.num_free == 4


def test_waiting_queue_limit():
    sched = make_scheduler(max_waiting=1)
    sched.add_request(make_request("a"))
    with pytest.raises(QueueFullError):
        sched.add_request(make_request("b"))


def test_abort_frees_blocks_at_once():
    sched = make_scheduler()
    sched.add_request(make_request("a", prompt_len=20, max_tokens=30))
    sched.add_request(make_request("b", prompt_len=20, max_tokens=30, first_token=400))
    run_step(sched)
    run_step(sched)
    sched.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert_no_leaks(sched)
    out = sched.schedule()
    assert out.finished_request_ids == {"a", "b"} and out.is_empty


def test_runner_failure_finishes_only_that_request_and_drops_its_cache():
    sched = make_scheduler()
    sched.add_request(make_request("bad", prompt_len=8))
    sched.add_request(make_request("good", prompt_len=8, first_token=300))
    out = sched.schedule()
    result = ModelRunnerOutput(sampled_token_ids={"good": [5]}, failed_request_ids={"bad": "boom"})
    core = {c.request_id: c for c in sched.update(out, result)}
    assert core["bad"].finish_reason == "error" and core["bad"].error == "boom"
    assert core["good"].finish_reason is None
    # The failed request's blocks are free and not findable as a cached prefix.
    retry = make_request("retry", prompt_len=8)
    assert sched.kv.get_computed_blocks(retry)[1] == 0
    drain(sched)
    assert_no_leaks(sched)


def test_eos_and_stop_tokens_finish():
    sched = make_scheduler()
    sched.add_request(make_request("eos", max_tokens=10))
    _, core = run_step(sched, token=EOS)
    assert core[0].finish_reason == "stop" and core[0].new_token_ids == [EOS]
    req = make_request("stoptok", max_tokens=10, first_token=300)
    req.sampling_params.stop_token_ids = [9]
    sched.add_request(req)
    _, core = run_step(sched, token=9)
    assert core[0].finish_reason == "stop" and core[0].stop_reason == 9
    req = make_request("ignore", max_tokens=3, first_token=500)
    req.sampling_params.ignore_eos = True
    sched.add_request(req)
    steps = drain(sched, token=EOS)
    assert steps[-1][1][0].finish_reason == "length" and req.num_output_tokens == 3
    assert_no_leaks(sched)


def test_prefix_cache_hits_respect_salt():
    sched = make_scheduler(block_size=4)
    sched.add_request(make_request("a", prompt_len=17, max_tokens=1, cache_salt="t1"))
    drain(sched)
    b = make_request("b", prompt_len=17, max_tokens=1, cache_salt="t1")
    c = make_request("c", prompt_len=17, max_tokens=1, cache_salt="t2")
    sched.add_request(b)
    sched.add_request(c)
    out, _ = run_step(sched)
    assert b.num_cached_tokens == 16 and c.num_cached_tokens == 0
    assert out.num_scheduled_tokens == {"b": 1, "c": 17}
    stats = sched.stats()
    assert stats.prefix_cache_hits == 16 and stats.prefix_cache_queries == 17 * 3


def test_n_siblings_wait_for_the_leader_then_share_its_prompt_blocks():
    sched = make_scheduler(block_size=4, max_num_batched_tokens=8)
    leader = make_request("p#0", prompt_len=13, max_tokens=2)
    sibling = make_request("p#1", prompt_len=13, max_tokens=2, wait_for=leader)
    sched.add_request(leader)
    sched.add_request(sibling)
    out, _ = run_step(sched)
    assert list(out.num_scheduled_tokens) == ["p#0"]  # sibling held back
    run_step(sched)  # leader finishes its prompt (8 + 5 tokens)
    run_step(sched)
    assert sibling.num_cached_tokens == 12
    shared = set(sched.kv.block_ids("p#0")[:3])
    assert shared <= set(sched.kv.block_ids("p#1"))
    drain(sched)
    assert_no_leaks(sched)


def test_itl_guard_caps_lower_tiers_prefill_while_a_protected_request_runs():
    sched = make_scheduler(max_num_batched_tokens=64, num_blocks=128, itl_guard_priority=10, itl_guard_tokens=8)
    sched.add_request(make_request("premium", prompt_len=6, max_tokens=20, priority=10))
    run_step(sched)  # premium's prompt; it decodes from now on
    sched.add_request(make_request("free-a", prompt_len=40, max_tokens=2, priority=30, first_token=300))
    sched.add_request(make_request("free-b", prompt_len=40, max_tokens=2, priority=30, first_token=600))
    out, _ = run_step(sched)
    # Without the guard free-a would take 40 tokens and free-b the rest of the budget.
    assert out.num_scheduled_tokens == {"premium": 1, "free-a": 8}
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 1, "free-a": 8}
    # A protected arrival is not capped, and the guard budget is shared by the lower tiers only.
    sched.add_request(make_request("premium-2", prompt_len=30, max_tokens=2, priority=10, first_token=900))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens["premium-2"] == 30 and out.num_scheduled_tokens["free-a"] == 8
    drain(sched)
    assert_no_leaks(sched)


def test_itl_guard_lifts_when_no_protected_request_is_left():
    sched = make_scheduler(max_num_batched_tokens=64, itl_guard_priority=10, itl_guard_tokens=8)
    sched.add_request(make_request("free", prompt_len=40, max_tokens=2, priority=30))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"free": 40}  # nothing to protect: the whole budget
    sched = make_scheduler(max_num_batched_tokens=64, itl_guard_priority=10, itl_guard_tokens=0)
    sched.add_request(make_request("premium", prompt_len=6, max_tokens=3, priority=10))
    sched.add_request(make_request("free", prompt_len=40, max_tokens=2, priority=30, first_token=300))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 6}  # tokens=0: no lower-tier prefill beside premium
    steps = drain(sched)
    assert any("free" in o.num_scheduled_tokens for o, _ in steps)  # it runs once premium is done
    assert_no_leaks(sched)


def test_itl_guard_config_is_checked():
    with pytest.raises(ValueError, match="itl_guard_tokens"):
        make_scheduler(itl_guard_priority=10, itl_guard_tokens=-1)


def test_a_zero_waiting_limit_is_refused_since_it_would_refuse_every_request():
    with pytest.raises(ValueError, match="max_waiting: must be >= 1"):
        make_scheduler(max_waiting=0)


def test_itl_guard_seats_hold_lower_tiers_back_but_not_protected_arrivals():
    sched = make_scheduler(max_num_seqs=8, itl_guard_priority=10, itl_guard_tokens=64, itl_guard_seqs=2)
    sched.add_request(make_request("premium", prompt_len=4, max_tokens=6, priority=10))
    for i in range(4):
        sched.add_request(make_request(f"free-{i}", prompt_len=4, max_tokens=3, priority=30, first_token=100 * (i + 2)))
    out, _ = run_step(sched)
    assert set(out.num_scheduled_tokens) == {"premium", "free-0", "free-1"}  # two lower-tier seats
    sched.add_request(make_request("premium-2", prompt_len=4, max_tokens=2, priority=10, first_token=900))
    out, _ = run_step(sched)
    assert "premium-2" in out.num_scheduled_tokens and "free-2" not in out.num_scheduled_tokens
    steps = drain(sched)
    assert any("free-3" in o.num_scheduled_tokens for o, _ in steps)  # admitted once seats free up
    assert_no_leaks(sched)


def test_itl_guard_step_cap_limits_every_prefill_while_a_protected_request_decodes():
    sched = make_scheduler(max_num_batched_tokens=64, num_blocks=128, itl_guard_priority=10, itl_guard_tokens=32,
                           itl_guard_step_tokens=12)
    sched.add_request(make_request("premium", prompt_len=30, max_tokens=20, priority=10))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 30}  # nobody decodes yet: no step cap
    sched.add_request(make_request("free", prompt_len=40, max_tokens=2, priority=30, first_token=300))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 1, "free": 12}  # under the lower tiers' own 32
    # A protected arrival is capped too, and takes the step's prefill ahead of the running free chunk.
    sched.add_request(make_request("premium-2", prompt_len=20, max_tokens=2, priority=10, first_token=900))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 1, "premium-2": 12}
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 1, "premium-2": 8, "free": 4}
    steps = drain(sched)
    assert all(sum(n for n in o.num_scheduled_tokens.values() if n > 1) <= 12
               for o, _ in steps if "premium" in o.num_scheduled_tokens)
    assert_no_leaks(sched)


def test_itl_guard_step_cap_config_is_checked():
    with pytest.raises(ValueError, match="itl_guard_step_tokens: must be >= 1"):
        make_scheduler(itl_guard_priority=10, itl_guard_step_tokens=0)
