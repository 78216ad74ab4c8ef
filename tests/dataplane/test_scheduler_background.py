"""Background work (the Batch API's lines, priority >= background_priority) runs only in steps that
online requests leave: paused with its blocks kept while online work is in the engine, resumed where
it was, preempted first when an online request needs its seat or blocks, never leaking."""

from dataplane.request import RequestStatus
from tests.dataplane.helpers import assert_no_leaks, make_request, make_scheduler, run_step

BG = 1000


def _drain(sched, limit=500):
    for _ in range(limit):
        if not sched.has_unfinished():
            return
        run_step(sched)
    raise AssertionError("scheduler did not finish")


def test_background_runs_alone_at_full_speed_when_nothing_else_is_in_the_engine():
    sched = make_scheduler(background_priority=BG)
    sched.add_request(make_request("b0", priority=BG, max_tokens=3))
    sched.add_request(make_request("b1", priority=BG, max_tokens=3, first_token=300))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"b0": 10, "b1": 10}
    assert sched.num_paused == 0
    _drain(sched)
    assert_no_leaks(sched)


def test_an_online_arrival_pauses_running_background_work_which_keeps_its_blocks_and_resumes_where_it_was():
    sched = make_scheduler(background_priority=BG)
    sched.add_request(make_request("batch", priority=BG, max_tokens=20))
    run_step(sched)  # its prompt and first token
    run_step(sched)
    batch = sched.requests["batch"]
    computed, blocks = batch.num_computed_tokens, list(sched.kv.block_ids("batch"))

    sched.add_request(make_request("premium", priority=10, max_tokens=4, first_token=500))
    steps_with_premium = 0
    while "premium" in sched.requests:
        out, _ = run_step(sched)
        steps_with_premium += 1
        assert "batch" not in out.num_scheduled_tokens  # every step while premium is in the engine is its own
        assert batch.status == RequestStatus.RUNNING and batch.num_computed_tokens == computed
        assert sched.kv.block_ids("batch") == blocks  # nothing recomputed later
    assert steps_with_premium == 4
    assert sched.num_preemptions == 0

    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"batch": 1}  # resumed with a decode, not a recompute
    assert sched.stats().num_paused == 0
    _drain(sched)
    assert_no_leaks(sched)


def test_background_is_not_started_while_an_online_request_waits_or_runs():
    sched = make_scheduler(background_priority=BG)
    sched.add_request(make_request("online", priority=20, max_tokens=3))
    sched.add_request(make_request("batch", priority=BG, max_tokens=3, first_token=300))
    out, _ = run_step(sched)
    assert set(out.num_scheduled_tokens) == {"online"}
    assert sched.requests["batch"].status == RequestStatus.WAITING
    _drain(sched)
    assert_no_leaks(sched)


def test_a_background_seat_is_taken_by_preemption_when_online_work_needs_it():
    sched = make_scheduler(background_priority=BG, max_num_seqs=2)
    for i in range(2):
        sched.add_request(make_request(f"b{i}", priority=BG, max_tokens=30, first_token=100 * (i + 1)))
    run_step(sched)
    sched.add_request(make_request("premium", priority=10, max_tokens=3, first_token=900))
    out, _ = run_step(sched)
    assert set(out.num_scheduled_tokens) == {"premium"}
    assert out.preempted_request_ids == ["b1"]  # the latest background line, recomputed later
    assert sched.num_paused == 1  # b0 keeps its seat and blocks, paused
    _drain(sched)
    assert_no_leaks(sched)


def test_paused_background_blocks_are_freed_for_online_work_that_runs_out_of_blocks():
    # 16 blocks of 4 tokens: the batch line holds 11 (40 prompt + 4 generated); premium needs 6.
    sched = make_scheduler(num_blocks=16, background_priority=BG)
    sched.add_request(make_request("batch", prompt_len=40, priority=BG, max_tokens=20))
    for _ in range(5):
        run_step(sched)
    sched.add_request(make_request("premium", prompt_len=20, priority=10, max_tokens=6, first_token=900))
    while "premium" in sched.requests:
        out, _ = run_step(sched)
        assert "batch" not in out.num_scheduled_tokens
    assert sched.num_preemptions == 1  # the paused line gave its blocks back
    _drain(sched)
    assert sched.requests == {}
    assert_no_leaks(sched)


def test_paused_background_lines_do_not_hold_the_itl_guards_seats_of_the_tiers_between():
    # The guard lets one lower-priority request run beside premium; a paused batch line is not it.
    sched = make_scheduler(background_priority=BG, itl_guard_priority=10, itl_guard_seqs=1)
    sched.add_request(make_request("batch", priority=BG, max_tokens=30))
    run_step(sched)
    sched.add_request(make_request("premium", priority=10, max_tokens=10, first_token=500))
    sched.add_request(make_request("standard", priority=20, max_tokens=10, first_token=700))
    out, _ = run_step(sched)
    assert set(out.num_scheduled_tokens) == {"premium", "standard"}
    _drain(sched)
    assert_no_leaks(sched)


def test_aging_never_turns_a_waiting_background_line_into_online_work():
    from tests.dataplane.helpers import FakeClock

    clock = FakeClock()
    sched = make_scheduler(background_priority=BG, clock=clock, aging_seconds=0.001)
    sched.add_request(make_request("online", priority=20, max_tokens=3, clock=clock))
    sched.add_request(make_request("batch", priority=BG, max_tokens=3, first_token=300, clock=clock))
    clock.now += 10.0  # aged far past every online priority
    out, _ = run_step(sched)
    assert set(out.num_scheduled_tokens) == {"online"}
    _drain(sched)
    assert_no_leaks(sched)


def test_without_a_background_priority_nothing_is_paused():
    sched = make_scheduler()
    sched.add_request(make_request("batch", priority=BG, max_tokens=5))
    run_step(sched)
    sched.add_request(make_request("premium", priority=10, max_tokens=3, first_token=500))
    out, _ = run_step(sched)
    assert set(out.num_scheduled_tokens) == {"batch", "premium"}


def test_background_steps_alone_stay_within_their_time_budget_and_online_steps_do_not():
    # A step costs 10 ms + 1 ms a token here: 30 ms fits 20 tokens.
    sched = make_scheduler(background_priority=BG, background_step_ms=30.0, max_num_batched_tokens=64)
    for k in range(20):
        sched.observe_step(4 + k * 3, 0.010 + 0.001 * (4 + k * 3))
    sched.add_request(make_request("batch", prompt_len=100, priority=BG, max_tokens=5))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"batch": 20}  # a short step: an arrival waits little for it
    sched.add_request(make_request("online", prompt_len=100, priority=20, max_tokens=2, first_token=900))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"online": 64}  # online work has the whole budget (batch paused)
    _drain(sched)
    assert_no_leaks(sched)
