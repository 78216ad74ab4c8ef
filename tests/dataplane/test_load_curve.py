"""The load curve's sweep times the steps it says it times, then leaves no trace."""

from __future__ import annotations

from dataplane.engine.llm import LLM
from dataplane.engine.load_curve import CONTEXT_TOKENS, LONG_CONTEXT_TOKENS, TIMED_STEPS, measure_load_curve
from dataplane.sampling_params import SamplingParams

from .step_spy import spy_steps

MODEL = "smollm2-135m-instruct"


def _llm(preloaded, **kw) -> LLM:
    args = {"dtype": "bfloat16", "kv_cache_memory": "64MiB", "max_num_seqs": 6, "max_num_batched_tokens": 128}
    return LLM(MODEL, preloaded=preloaded, **{**args, **kw})


def test_the_sweep_times_decode_steps_of_each_batch_and_single_prefills_then_forgets_them(smollm_bf16):
    llm = _llm(smollm_bf16)
    seen = spy_steps(llm)  # (requests, tokens) per step, as the runner got them
    curve = measure_load_curve(llm.core)
    assert [b for b, _ in curve["decode"]] == [1, 2, 4, 6]
    assert [n for n, _ in curve["prefill"]] == [32, 128]
    assert curve["long_context"]["batch"] == 2 and curve["long_context"]["tokens"] == LONG_CONTEXT_TOKENS
    # Each timed decode step really was a decode step of that batch (one token per request), and
    # each prefill one prompt of that size in one step.
    for b in (1, 2, 4, 6):
        assert seen.count((b, b)) >= TIMED_STEPS
    for n in (32, 128):
        assert seen.count((1, n)) >= 2
    assert all(s > 0 for _, s in curve["decode"] + curve["prefill"])
    # Bigger work costs more: the longest prefill over the shortest, the long context over the short.
    prefill = dict(curve["prefill"])
    assert prefill[128] > prefill[32]
    assert curve["long_context"]["seconds"] > 0
    assert curve["max_num_seqs"] == 6 and curve["max_num_batched_tokens"] == 128
    assert curve["kv_cache_tokens"] == llm.core.memory.kv_cache_tokens and curve["sweep_seconds"] > 0
    # Nothing left running, counted, cached or fitted.
    stats = llm.core.stats()
    assert not llm.core.has_unfinished() and not llm.core.processor.parents
    assert (stats.prompt_tokens, stats.generation_tokens, stats.prefix_cache_queries, stats.prefix_cache_hits) == (0,) * 4
    assert stats.num_free_blocks == stats.num_blocks and not llm.core.scheduler.kv.pool.cached
    assert llm.core.scheduler.step_cost.fit() is None
    params = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0)
    cold = _llm(smollm_bf16)
    prompt = "The capital of France is"
    assert llm.generate(prompt, params)[0].outputs[0].token_ids == cold.generate(prompt, params)[0].outputs[0].token_ids


def test_a_small_cache_measures_only_what_fits_without_preempting(smollm_bf16):
    llm = _llm(smollm_bf16, kv_cache_memory="2MiB", max_num_seqs=32)  # a few hundred tokens of cache
    capacity = llm.core.memory.kv_cache_tokens
    curve = measure_load_curve(llm.core)
    assert curve["decode"] and all(b * (CONTEXT_TOKENS + TIMED_STEPS + 4) <= capacity for b, _ in curve["decode"])
    assert max(b for b, _ in curve["decode"]) < 32
    if 2 * (LONG_CONTEXT_TOKENS + TIMED_STEPS + 4) > capacity:
        assert curve["long_context"] is None
    assert all(n + 2 <= capacity for n, _ in curve["prefill"])
    assert llm.core.scheduler.num_preemptions == 0
    stats = llm.core.stats()
    assert stats.num_free_blocks == stats.num_blocks


def test_the_sweep_refuses_an_engine_that_is_serving(smollm_bf16):
    import pytest

    llm = _llm(smollm_bf16)
    rid, text, children = llm.core.make_requests([1, 2, 3], SamplingParams(max_tokens=4))
    llm.core.add(rid, text, children)
    with pytest.raises(RuntimeError, match="has requests"):
        measure_load_curve(llm.core)
