"""Overlapped scheduling (EngineCore._step_overlapped) on the CPU: step N+1 is scheduled and launched
before step N's tokens reach the host, N+1's decodes reading N's tokens where they were sampled. There
is little to hide on a CPU; what is tested here is that nothing changes: the same tokens, logprobs,
finish reasons and usage as the synchronous engine, through stops, preemption, aborts, prefix-cache
hits and requests that need the host every step."""

from __future__ import annotations

import asyncio

import pytest

from dataplane import LLM, SamplingParams
from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig
from dataplane.engine.async_llm import AsyncLLM
from dataplane.structured.params import StructuredOutputs
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors
from tests.dataplane.same_outputs import assert_same_outputs, mixed_params

SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]  # a prefix several prompts share (2.5 blocks of 4)


@pytest.fixture(scope="module")
def tiny():
    args = tiny_args()
    return loaded(args, tiny_tensors(args, seed=11))


def _llm(model, overlap: bool, **kw) -> LLM:
    options = {"block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 24, "kv_cache_memory": "1MiB"}
    options.update(kw)
    return LLM("tiny", dtype="float32", preloaded=model, async_scheduling=overlap, **options)


def _workload():
    prompts, params = [], []
    for i in range(10):
        prompts.append((SHARED if i % 3 == 0 else []) + [2 + (5 * i + 3 * j) % 90 for j in range(2 + 3 * i)])
        params.append(mixed_params(i, (4 + 3 * i, 6 + i, 3 + 2 * i, 5 + i)[i % 4]))
    return prompts, params


def test_overlap_gives_the_synchronous_outputs(tiny):
    prompts, params = _workload()
    sync = _llm(tiny, False)
    overlapped = _llm(tiny, True)
    assert overlapped.core.overlap and not sync.core.overlap
    want = sync.generate(prompts, params)
    got = overlapped.generate(prompts, params)
    assert_same_outputs(want, got)
    assert overlapped.core.runner.steps_reading_in_flight > 20 and sync.core.runner.steps_reading_in_flight == 0
    s, o = sync.core.scheduler, overlapped.core.scheduler
    assert (o.generation_tokens, o.prompt_tokens) == (s.generation_tokens, s.prompt_tokens)  # usage counted alike
    assert o.kv.pool.num_free == o.kv.num_blocks  # every block back
    assert not overlapped.core.has_unfinished()


def test_overlap_under_preemption(tiny):
    """A cache too small for the batch: requests are preempted while a step of theirs is in flight."""
    prompts, params = _workload()
    small = {"kv_cache_memory": 24 * 4 * 2 * 2 * 2 * 16 * 4}  # 24 blocks of 4 tokens (2 layers, 2 kv heads, d 16)
    want = _llm(tiny, False, **small).generate(prompts, params)
    overlapped = _llm(tiny, True, **small)
    got = overlapped.generate(prompts, params)
    assert overlapped.core.scheduler.num_preemptions > 0
    for x, y in zip(want, got, strict=True):  # preemption timing may differ: unseeded draws do not recur
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            if cx.logprobs is not None or x.outputs[0].finish_reason == "length":
                assert cy.token_ids == cx.token_ids
    assert overlapped.core.scheduler.kv.pool.num_free == overlapped.core.scheduler.kv.num_blocks


def test_a_request_that_needs_the_host_makes_the_steps_synchronous(tiny):
    prompts, params = _workload()
    prompts.append([5, 6, 7])
    params.append(SamplingParams(max_tokens=12, temperature=0.0, structured=StructuredOutputs(choice=["w3 w4", "w5"])))
    prompts.append([8, 9])
    params.append(SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, repetition_penalty=1.3))
    want = _llm(tiny, False).generate(prompts, params)
    overlapped = _llm(tiny, True)
    got = overlapped.generate(prompts, params)
    assert_same_outputs(want, got)
    assert got[-2].outputs[0].text in ("w3 w4", "w5")
    # While those two ran every step was synchronous; the others' later steps overlapped.
    assert overlapped.core.runner.steps_reading_in_flight > 0


def test_stop_strings_and_aborts_through_async_llm(tiny):
    """Stop strings are found on the caller's loop, steps after the engine computed further: the client
    sees the text up to the stop, the same as without overlap; a caller that leaves frees its blocks."""

    async def run(overlap: bool):
        engine = AsyncLLM(ModelConfig(model="tiny", dtype="float32"), CacheConfig(block_size=4, kv_cache_memory="1MiB"),
                          SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=24, async_scheduling=overlap),
                          progress=False, preloaded=tiny)
        try:
            async def collect(i, stop):
                text, tokens, finish = "", [], None
                params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=stop)
                async for out in engine.generate([3 + i, 4, 5 + i], params, request_id=f"r{i}"):
                    text += out.outputs[0].text
                    tokens += out.outputs[0].token_ids
                    finish = out.outputs[0].finish_reason
                return text, tokens, finish

            async def leave_early():
                params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
                async for _ in engine.generate([30, 31, 32], params, request_id="leaver"):
                    break

            # the stop string is a word the greedy output of each prompt contains (found below)
            plain = await asyncio.gather(*(collect(i, None) for i in range(4)))
            stops = [[t.split()[len(t.split()) // 2]] for t, _, _ in plain]
            results = await asyncio.gather(*(collect(i, stops[i]) for i in range(4)), leave_early())
            for _ in range(100):
                if not engine.core.has_unfinished():
                    break
                await asyncio.sleep(0.02)
            pool = engine.core.scheduler.kv.pool
            return results[:4], pool.num_free == pool.num_blocks, engine.core.runner.steps_reading_in_flight
        finally:
            engine.shutdown()

    want, freed_sync, _ = asyncio.run(run(False))
    got, freed, overlapped = asyncio.run(run(True))
    assert overlapped > 0 and freed and freed_sync
    assert got == want
    assert all(finish == "stop" for _, _, finish in got)
