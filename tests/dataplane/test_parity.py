"""Greedy output equals Hugging Face transformers' LlamaForCausalLM, token for token, in float32."""

from __future__ import annotations

import pytest

from dataplane import LLM, SamplingParams
from tests.dataplane.conftest import MODEL, PROMPTS, hf_greedy

pytestmark = [pytest.mark.slow, pytest.mark.model]

MAX_TOKENS = 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(smollm_fp32, hf_reference):
    ids = [smollm_fp32.tokenizer.encode(p) for p in PROMPTS]
    return ids, [hf_greedy(hf_reference, p, MAX_TOKENS) for p in ids]


def _engine(loaded, **kw):
    return LLM(MODEL, dtype="float32", preloaded=loaded, **kw)


def test_batched_equals_transformers(smollm_fp32, expected):
    ids, want = expected
    llm = _engine(smollm_fp32, max_num_seqs=16, max_num_batched_tokens=256)
    outs = llm.generate(ids, GREEDY)
    for i, (o, w) in enumerate(zip(outs, want, strict=True)):
        assert o.token_ids == w, f"prompt {i} diverged"
    assert llm.core.stats().num_free_blocks == llm.core.memory.num_blocks


def test_one_by_one_equals_transformers(smollm_fp32, expected):
    ids, want = expected
    llm = _engine(smollm_fp32, enable_prefix_caching=False)
    for p, w in zip(ids, want, strict=True):
        assert llm.generate([p], GREEDY)[0].token_ids == w


def test_prefix_cache_hits_give_the_same_tokens(smollm_fp32, expected):
    ids, want = expected
    llm = _engine(smollm_fp32, max_num_batched_tokens=128)
    llm.generate(ids, GREEDY)  # fills the prefix cache
    hits_before = llm.core.stats().prefix_cache_hits
    outs = llm.generate(ids, GREEDY)
    assert llm.core.stats().prefix_cache_hits > hits_before
    assert any(o.num_cached_tokens > 0 for o in outs)
    for o, w in zip(outs, want, strict=True):
        assert o.token_ids == w


def test_small_cache_forces_preemption_and_still_matches(smollm_fp32, expected):
    ids, want = expected
    # Room for 320 tokens: the eight requests (~740 tokens with outputs) cannot all stay resident.
    per_block = 16 * 2 * 30 * 3 * 64 * 4
    llm = _engine(smollm_fp32, kv_cache_memory=20 * per_block, max_num_batched_tokens=64)
    outs = llm.generate(ids, GREEDY)
    assert llm.core.stats().num_preemptions > 0
    for i, (o, w) in enumerate(zip(outs, want, strict=True)):
        assert o.token_ids == w, f"prompt {i} diverged after preemption"
    assert llm.core.stats().num_free_blocks == llm.core.memory.num_blocks
