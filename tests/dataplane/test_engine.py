"""The engine end to end on the real model: API contract, bad input, n > 1, seeds, stops, abort."""

from __future__ import annotations

import asyncio

import pytest

from dataplane import LLM, SamplingParams
from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig
from dataplane.engine.async_llm import AsyncLLM
from tests.dataplane.conftest import MODEL

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def llm(smollm_fp32):
    return LLM(MODEL, dtype="float32", preloaded=smollm_fp32, max_num_seqs=16, kv_cache_memory="64MiB")


def _idle(llm: LLM) -> bool:
    s = llm.core.stats()
    return s.num_running == 0 and s.num_waiting == 0 and s.num_free_blocks == s.num_blocks


@pytest.mark.parametrize("prompt,params,field", [
    ("", SamplingParams(), "prompt"),
    ([], SamplingParams(), "prompt"),
    ([10**9], SamplingParams(), "prompt"),
    ("hello " * 5000, SamplingParams(max_tokens=8), "prompt"),
    ("hi", SamplingParams(max_tokens=8190), "prompt"),
])
def test_bad_input_is_refused_before_scheduling(llm, prompt, params, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        llm.generate([prompt], params)
    assert _idle(llm)


def test_one_bad_prompt_refuses_the_call_and_queues_nothing(llm):
    with pytest.raises(ValueError, match="prompt"):
        llm.generate(["fine", ""], SamplingParams(max_tokens=2))
    assert _idle(llm)


def test_unknown_model_is_a_value_error():
    with pytest.raises(ValueError, match="^model: unknown model"):
        LLM("no-such-model")


def test_output_contract(llm):
    (out,) = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0.0))
    assert out.prompt_token_ids == llm.tokenizer.encode("The capital of France is")
    assert 1 <= len(out.token_ids) <= 8 and out.finish_reason in ("stop", "length")
    assert out.text == llm.tokenizer.decode(out.token_ids)
    assert 0 < out.metrics.ttft <= out.metrics.e2e


def test_chat_applies_the_template(llm):
    (out,) = llm.chat([{"role": "user", "content": "What is 2 + 2?"}], SamplingParams(max_tokens=12, temperature=0.0))
    start = llm.tokenizer.backend.token_to_id("<|im_start|>")
    assert out.prompt_token_ids[0] == start
    assert out.text.strip()


def test_n_completions_share_the_prompt_blocks(llm):
    prompt = "Write a haiku about the sea. " * 8
    hits = llm.core.stats().prefix_cache_hits
    (out,) = llm.generate([prompt], SamplingParams(n=3, max_tokens=10, temperature=1.0, seed=11))
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "siblings must not be copies"
    prompt_blocks = (len(out.prompt_token_ids) - 1) // 16
    assert llm.core.stats().prefix_cache_hits - hits >= 2 * prompt_blocks * 16
    assert _idle(llm)


def test_seeded_request_is_reproducible_whatever_its_batch_mates(llm):
    p = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=2024)
    (alone,) = llm.generate(["Tell me a story about a fox."], p)
    mates = ["Random chatter one", "Another unrelated prompt that is a bit longer than the others", "x"]
    outs = llm.generate(mates[:2] + ["Tell me a story about a fox."] + mates[2:],
                        [SamplingParams(max_tokens=20, temperature=1.0)] * 2 + [p] + [SamplingParams(max_tokens=5)])
    assert outs[2].token_ids == alone.token_ids


def test_logit_bias_forces_bans_and_is_checked_against_the_vocabulary(llm):
    prompt = "The capital of France is"
    (free,) = llm.generate([prompt], SamplingParams(max_tokens=3, temperature=0.0))
    first = free.token_ids[0]
    (banned,) = llm.generate([prompt], SamplingParams(max_tokens=3, temperature=0.0, logit_bias={first: -100}))
    assert banned.token_ids[0] != first
    comma = llm.tokenizer.encode(",")[-1]
    (forced,) = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.7, seed=1, logit_bias={comma: 100}))
    assert forced.token_ids == [comma] * 4
    with pytest.raises(ValueError, match="^logit_bias: token id 999999 is outside the vocabulary"):
        llm.generate([prompt], SamplingParams(max_tokens=2, logit_bias={999999: 1}))
    assert _idle(llm)


def test_seeded_request_survives_preemption(smollm_fp32):
    p = SamplingParams(max_tokens=60, temperature=1.0, seed=5, ignore_eos=True)
    big = LLM(MODEL, dtype="float32", preloaded=smollm_fp32)
    (want,) = big.generate(["Once upon a time"], p)
    per_block = 16 * 2 * 30 * 3 * 64 * 4
    small = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=6 * per_block)
    others = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    outs = small.generate(["Once upon a time", "A second long request to compete for blocks"],
                          [p, others], priorities=[1, 0])
    assert small.core.stats().num_preemptions > 0
    assert outs[0].token_ids == want.token_ids


def test_stop_string_found_in_generated_text(llm):
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    (full,) = llm.generate(["Count: one, two, three,"], greedy)
    assert len(full.text) > 12
    stop = full.text[8:12]
    cut = full.text.index(stop)
    (out,) = llm.generate(["Count: one, two, three,"], SamplingParams(max_tokens=30, temperature=0.0,
                                                                       ignore_eos=True, stop=[stop]))
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.text == full.text[:cut]
    assert _idle(llm)


def test_stop_token_ids_and_logprobs(llm):
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2)
    (full,) = llm.generate(["Hello, my name is"], greedy)
    assert len(full.outputs[0].logprobs) == len(full.token_ids)
    first = full.outputs[0].logprobs[0]
    assert first.token_id == full.token_ids[0] and first.top[0][0] == full.token_ids[0] and first.logprob <= 0
    target = full.token_ids[3]
    (out,) = llm.generate(["Hello, my name is"], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True,
                                                                stop_token_ids=[target]))
    assert out.token_ids == full.token_ids[: full.token_ids.index(target) + 1]
    assert out.outputs[0].stop_reason == target


def test_async_abort_frees_blocks_within_a_step(smollm_fp32):
    async def scenario():
        engine = AsyncLLM(ModelConfig(MODEL, dtype="float32"), CacheConfig(kv_cache_memory="32MiB"),
                          SchedulerConfig(), progress=False, preloaded=smollm_fp32)
        try:
            long = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
            got = 0
            agen = engine.generate("Tell me everything about the ocean.", long)
            async for delta in agen:
                got += len(delta.outputs[0].token_ids) if delta.outputs else 0
                if got >= 3:
                    break
            await agen.aclose()
            # Another request keeps running meanwhile and finishes normally.
            text = ""
            async for delta in engine.generate("Hi", SamplingParams(max_tokens=5, temperature=0.0)):
                text += "".join(c.text for c in delta.outputs)
            for _ in range(50):
                s = engine.latest_stats
                if s.num_running == 0 and s.num_free_blocks == s.num_blocks:
                    break
                await asyncio.sleep(0.05)
            assert s.num_running == 0 and s.num_free_blocks == s.num_blocks
            assert s.generation_tokens < 100
            with pytest.raises(ValueError, match="temperature"):
                SamplingParams(temperature=-1)
            with pytest.raises(ValueError, match="prompt"):
                async for _ in engine.generate("", SamplingParams()):
                    pass
        finally:
            engine.shutdown()

    asyncio.run(scenario())
