"""The ITL guard's timed step budget: an online step-cost model, and the prefill cap it sets."""

import random

import pytest

from dataplane.config import SchedulerConfig
from dataplane.scheduler.scheduler import ITL_GUARD_MIN_PREFILL
from dataplane.scheduler.step_cost import StepCostModel
from tests.dataplane.helpers import assert_no_leaks, make_request, make_scheduler, run_step


def test_cost_model_recovers_a_linear_step_time():
    rng = random.Random(0)
    model = StepCostModel()
    for _ in range(200):
        tokens = rng.randint(1, 64)
        model.observe(tokens, (0.050 + 0.002 * tokens) * rng.uniform(0.95, 1.05))
    base, per_token = model.fit()
    assert base == pytest.approx(0.050, rel=0.1) and per_token == pytest.approx(0.002, rel=0.1)
    # 80 ms leaves 30 ms over the base: about 15 tokens.
    assert 13 <= model.tokens_within(0.080) <= 17
    assert model.tokens_within(0.040) == 0  # below the base cost nothing fits


def test_cost_model_abstains_until_it_has_seen_enough_varied_steps():
    model = StepCostModel()
    for _ in range(7):
        model.observe(8, 0.06)
    assert model.fit() is None  # too few steps
    for _ in range(50):
        model.observe(8, 0.06)
    assert model.fit() is None  # many steps, all one size: no slope
    model.observe(0, 0.01)  # an empty step teaches nothing
    assert model._n == 57


def test_cost_model_follows_the_host_as_it_changes():
    model = StepCostModel()
    for i in range(100):
        model.observe(1 + i % 32, 0.020 + 0.001 * (1 + i % 32))
    before = model.tokens_within(0.080)
    for i in range(200):  # the host slows down 2x (contention)
        model.observe(1 + i % 32, 2 * (0.020 + 0.001 * (1 + i % 32)))
    after = model.tokens_within(0.080)
    assert before == pytest.approx(60, abs=2) and after == pytest.approx(20, abs=2)


def _warm(sched, base_s: float, per_token_s: float) -> None:
    for tokens in range(1, 40, 3):
        sched.observe_step(tokens, base_s + per_token_s * tokens)


def test_timed_budget_caps_prefill_while_a_protected_request_decodes():
    sched = make_scheduler(max_num_batched_tokens=64, num_blocks=128, itl_guard_priority=10, itl_guard_tokens=64,
                           itl_guard_step_ms=80)
    _warm(sched, 0.050, 0.002)  # 80 ms fits 15 tokens
    sched.add_request(make_request("premium", prompt_len=30, max_tokens=30, priority=10))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 30}  # nobody decodes yet: no cap
    sched.add_request(make_request("free", prompt_len=60, max_tokens=2, priority=30, first_token=300))
    out, _ = run_step(sched)
    # 15 tokens fit; the premium decode takes one, the free prompt gets the other 14.
    assert out.num_scheduled_tokens == {"premium": 1, "free": 14}
    # The host gets slower: the model follows and the cap shrinks, never below the floor.
    for _ in range(300):
        for tokens in (1, 9, 17):
            sched.observe_step(tokens, 0.070 + 0.004 * tokens)
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 1, "free": ITL_GUARD_MIN_PREFILL}
    while sched.has_unfinished():
        run_step(sched)
    assert_no_leaks(sched)


def test_timed_budget_and_fixed_cap_take_the_smaller():
    sched = make_scheduler(max_num_batched_tokens=64, num_blocks=128, itl_guard_priority=10, itl_guard_tokens=64,
                           itl_guard_step_ms=200, itl_guard_step_tokens=6)
    _warm(sched, 0.050, 0.002)  # 200 ms would fit 75 tokens
    sched.add_request(make_request("premium", prompt_len=10, max_tokens=10, priority=10))
    run_step(sched)
    sched.add_request(make_request("free", prompt_len=40, max_tokens=2, priority=30, first_token=300))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 1, "free": 6}


def test_timed_budget_waits_for_the_model_and_applies_only_while_protected_decodes():
    sched = make_scheduler(max_num_batched_tokens=64, num_blocks=128, itl_guard_priority=10, itl_guard_tokens=64,
                           itl_guard_step_ms=80)
    sched.add_request(make_request("premium", prompt_len=10, max_tokens=10, priority=10))
    run_step(sched)
    sched.add_request(make_request("free", prompt_len=40, max_tokens=2, priority=30, first_token=300))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"premium": 1, "free": 40}  # no model yet: no timed cap
    free_only = make_scheduler(max_num_batched_tokens=64, num_blocks=128, itl_guard_priority=10,
                               itl_guard_tokens=64, itl_guard_step_ms=80)
    _warm(free_only, 0.050, 0.002)
    free_only.add_request(make_request("free", prompt_len=40, max_tokens=2, priority=30))
    out, _ = run_step(free_only)
    assert out.num_scheduled_tokens == {"free": 40}  # no protected request decoding: no cap


@pytest.mark.model
def test_engine_feeds_the_model_with_its_own_step_times(smollm_fp32):
    """A real engine times each runner call and hands it to the scheduler: after prefill chunks and
    decodes of different sizes the model answers, with a positive per-token cost."""
    from dataplane import LLM, SamplingParams
    from tests.dataplane.conftest import MODEL

    # Steps from 1 to 128 tokens: a wide spread, so the slope shows through a loaded host's noise.
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, max_num_seqs=8, max_num_batched_tokens=128,
              kv_cache_memory="64MiB", itl_guard_priority=10, itl_guard_step_ms=500)
    prompts = [list(range(100 + i, 100 + i + n)) for i, n in enumerate((5, 200, 300, 12))]
    llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    model = llm.core.scheduler.step_cost
    assert model._n >= 12  # every step with tokens was observed
    base, per_token = model.fit()
    # A measured slope, not the fit's floor of 1e-6: longer prefill chunks took longer than decodes.
    assert per_token > 1e-5 and 0 <= base < 1.0


def test_step_ms_is_checked():
    with pytest.raises(ValueError, match="itl_guard_step_ms: must be > 0"):
        SchedulerConfig(itl_guard_priority=10, itl_guard_step_ms=0)
