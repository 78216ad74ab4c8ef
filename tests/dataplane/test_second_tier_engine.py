"""The second tier in the engine on the real SmolLM2: a conversation whose history the KV cache evicted
comes back from the tier with exactly the bytes a big enough cache would have kept, a corrupt tier costs a
recompute and nothing else, and no block is leaked."""

from __future__ import annotations

import pytest

from dataplane import LLM, SamplingParams
from tests.dataplane.conftest import MODEL

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
F32_BLOCK = 16 * 2 * 30 * 3 * 64 * 4  # bytes of one float32 block: 16 tokens x K and V x 30 layers x 3 x 64
# Four conversations of ~150-token histories; the small cache (24 blocks, 384 tokens) holds about two.
HISTORIES = [f"Conversation {i} about {topic}. " + f"We keep talking about {topic} at length. " * 14
             for i, topic in enumerate(("rivers", "compilers", "bread", "orbits"))]


def turns(llm: LLM, rounds: int = 2, between=None) -> list:
    outs = []
    for turn in range(rounds):
        for history in HISTORIES:
            (o,) = llm.generate([history + f" Question {turn}: why?"], GREEDY)
            outs.append(o)
            tier = llm.core.scheduler.kv.tier
            if tier is not None:
                tier.flush()  # saves are written on a thread; the next request must see this one's
        if between is not None:
            between(turn)
    return outs


def idle(llm: LLM) -> bool:
    s = llm.core.stats()
    return s.num_free_blocks == llm.core.memory.num_blocks and s.num_running == s.num_waiting == 0


def test_the_tier_returns_what_a_big_enough_cache_would_have_kept(smollm_fp32):
    big = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=200 * F32_BLOCK)
    small = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=24 * F32_BLOCK)
    tiered = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=24 * F32_BLOCK,
                 kv_offload_size=200 * F32_BLOCK)
    want, plain, got = turns(big), turns(small), turns(tiered)
    # The same bytes as the big cache's hits: the same tokens and the same logprobs, exactly.
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.outputs[0].logprobs for o in got] == [o.outputs[0].logprobs for o in want]
    assert [o.num_cached_tokens for o in got] == [o.num_cached_tokens for o in want]
    assert [o.token_ids for o in plain] == [o.token_ids for o in want]
    # Returning turns: the small cache alone recomputed their histories; the tier brought them back.
    returning = slice(len(HISTORIES), None)
    assert sum(o.num_cached_tokens for o in plain[returning]) < sum(o.num_cached_tokens for o in got[returning]) / 4
    stats = tiered.core.stats()
    assert stats.kv_offload.failed_loads == 0
    assert stats.kv_offload.loaded_blocks * 16 > stats.prefix_cache_hits / 2  # most hits came from the tier
    assert stats.prompt_tokens < small.core.stats().prompt_tokens * 0.6
    assert stats.prefix_cache_hits == big.core.stats().prefix_cache_hits
    assert idle(tiered) and idle(small)
    tiered.core.close()


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_a_corrupt_directory_tier_costs_a_recompute_not_a_wrong_token(smollm_fp32, tmp_path, kv_cache_dtype):
    per_block = 16 * 2 * 30 * 3 * (66 if kv_cache_dtype == "fp8" else 256)
    small = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=24 * per_block,
                kv_cache_dtype=kv_cache_dtype)
    tiered = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=24 * per_block,
                 kv_cache_dtype=kv_cache_dtype, kv_offload_size=200 * per_block, kv_offload_dir=str(tmp_path))
    corrupted = []

    def corrupt(turn: int) -> None:
        if turn == 0:
            corrupted.extend(tmp_path.glob("*.kv"))
            for f in corrupted:  # a bit flipped in every block the tier holds
                data = bytearray(f.read_bytes())
                data[-1] ^= 0x10
                f.write_bytes(bytes(data))

    want = turns(small, rounds=3)  # this cycle of conversations defeats the small cache's LRU: no hits
    got = turns(tiered, rounds=3, between=corrupt)
    assert corrupted, "the first round evicted nothing to the tier"
    t = tiered.core.stats().kv_offload
    assert t.failed_loads >= 1
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(o.num_cached_tokens for o in got) > 0 == sum(o.num_cached_tokens for o in want)
    assert t.loaded_blocks > 0 and idle(tiered)
    tiered.core.close()


def test_a_tier_needs_the_prefix_cache(smollm_bf16):
    with pytest.raises(ValueError, match="kv_offload_size"):
        LLM(MODEL, preloaded=smollm_bf16, kv_offload_size="1GiB", enable_prefix_caching=False)
