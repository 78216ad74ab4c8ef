"""The start-up warm-up runs every decode batch size and the prefill ladder, then leaves no trace."""

from __future__ import annotations

from dataplane.engine.llm import LLM
from dataplane.engine.warmup import warm_up
from dataplane.sampling_params import SamplingParams

from .step_spy import spy_steps

MODEL = "smollm2-135m-instruct"


def test_warm_up_runs_each_decode_batch_size_and_prefill_size_then_forgets_it(smollm_bf16):
    llm = LLM(MODEL, dtype="bfloat16", kv_cache_memory="64MiB", max_num_seqs=6, max_num_batched_tokens=64,
              preloaded=smollm_bf16)
    seen = spy_steps(llm)  # (requests, tokens) per step, as the runner got them
    report = warm_up(llm.core)
    decode_batches = {n for n, tokens in seen if n == tokens}
    assert set(range(1, 7)) <= decode_batches
    assert {(1, 16), (1, 32), (1, 64)} <= set(seen)  # the prefill ladder up to the step budget
    assert report.prefill_sizes == [16, 32, 64] and report.decode_batch_sizes == 6 and report.steps == len(seen)
    # Nothing left running, counted or cached: metrics and billing start from zero.
    stats = llm.core.stats()
    assert not llm.core.has_unfinished()
    assert (stats.prompt_tokens, stats.generation_tokens, stats.prefix_cache_queries, stats.prefix_cache_hits) == (0,) * 4
    assert stats.num_free_blocks == stats.num_blocks and not llm.core.scheduler.kv.pool.cached
    assert llm.core.scheduler.step_cost.fit() is None
    # And the engine then serves as a cold one does (greedy: the same tokens).
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0)
    cold = LLM(MODEL, dtype="bfloat16", kv_cache_memory="64MiB", max_num_seqs=6, max_num_batched_tokens=64,
               preloaded=smollm_bf16)
    prompt = "The capital of France is"
    assert llm.generate(prompt, params)[0].outputs[0].token_ids == cold.generate(prompt, params)[0].outputs[0].token_ids
    assert llm.core.stats().generation_tokens == 8
