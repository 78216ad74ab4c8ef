"""Prompt logprobs equal transformers' log-softmax on the real SmolLM2-135M, float32, within 1e-4 nats,
whether the prompt is computed in one chunk or many, cold or with its blocks in the prefix cache
(a request asking for them skips the prefix-cache lookup), and after a preemption's recompute."""

from __future__ import annotations

import pytest
import torch

from dataplane import LLM, SamplingParams
from tests.dataplane.conftest import MODEL, PROMPTS

pytestmark = [pytest.mark.slow, pytest.mark.model]

# float32 on both sides: the engine's kernels and transformers' differ by reduction order only. Measured
# worst difference on these prompts is 2.4e-5 nats; 1e-4 leaves room across CPUs without hiding a wrong
# position (an off-by-one in the shift is off by whole nats).
TOL = 1e-4
K = 5


@pytest.fixture(scope="module")
def reference(smollm_fp32, hf_reference):
    """Per prompt: (ids, logprob of each token 1.., top-K ids per position 1..)."""
    out = []
    for p in PROMPTS:
        ids = smollm_fp32.tokenizer.encode(p)
        with torch.inference_mode():
            logits = hf_reference(torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)[:-1]
        chosen = lp.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
        out.append((ids, chosen.tolist(), lp.topk(K, dim=-1).indices.tolist()))
    return out


def _params(max_tokens=1, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, prompt_logprobs=K, **kw)


def _check(out, ids, want, top):
    got = out.prompt_logprobs
    assert got is not None and len(got) == len(ids) and got[0] is None
    assert [e.token_id for e in got[1:]] == ids[1:]
    worst = max((abs(e.logprob - w) for e, w in zip(got[1:], want, strict=True)), default=0.0)
    assert worst <= TOL, f"prompt logprobs differ from transformers by {worst}"
    for e, t in zip(got[1:], top, strict=True):
        assert len(e.top) == K
        # the best alternative is the same token (near-ties could swap lower ranks)
        assert e.top[0][0] == t[0] or abs(e.top[0][1] - e.top[1][1]) < TOL


def test_one_chunk_and_many_chunks_equal_transformers(smollm_fp32, reference):
    for batched in (2048, 32):  # whole prompts in a step; then 32-token chunks across steps
        llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, max_num_batched_tokens=batched,
                  enable_prefix_caching=False)
        outs = llm.generate([ids for ids, _, _ in reference], _params())
        for o, (ids, want, top) in zip(outs, reference, strict=True):
            _check(o, ids, want, top)


def test_cached_prompt_gives_the_same_prompt_logprobs(smollm_fp32, reference):
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, max_num_batched_tokens=64)
    ids = [r[0] for r in reference]
    plain = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate(ids, plain)  # every full block of every prompt is now in the prefix cache
    again = llm.generate(ids, plain)
    assert any(o.num_cached_tokens > 0 for o in again), "the cache should serve the repeat"
    assert all(o.prompt_logprobs is None for o in again), "nobody asked: nothing computed"
    outs = llm.generate(ids, _params())
    assert all(o.num_cached_tokens == 0 for o in outs), "a prompt-logprobs request skips the lookup"
    for o, (p, want, top) in zip(outs, reference, strict=True):
        _check(o, p, want, top)


def test_preemption_recompute_keeps_one_entry_per_position(smollm_fp32, reference):
    per_block = 16 * 2 * 30 * 3 * 64 * 4
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory=20 * per_block,
              max_num_batched_tokens=64)
    outs = llm.generate([r[0] for r in reference], _params(max_tokens=24, ignore_eos=True))
    assert llm.core.stats().num_preemptions > 0
    for o, (ids, want, top) in zip(outs, reference, strict=True):
        _check(o, ids, want, top)


def test_n_siblings_share_the_prompt_and_report_it_once(smollm_fp32, reference):
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32)
    ids, want, top = reference[4]
    out = llm.generate([ids], SamplingParams(n=3, max_tokens=4, temperature=1.0, seed=1, prompt_logprobs=K))[0]
    assert len(out.outputs) == 3
    _check(out, ids, want, top)


def test_zero_alternatives_and_one_token_prompt(smollm_fp32):
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32)
    one = llm.generate([[42]], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert one.prompt_logprobs == [None]
    two = llm.generate([[42, 43, 44]], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert [e.top for e in two.prompt_logprobs[1:]] == [[], []]


def test_prompt_logprobs_is_range_checked():
    for bad in (-1, 21, True, 1.5):
        with pytest.raises(ValueError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=bad)


def test_max_tokens_zero_scores_without_generating(smollm_fp32, reference):
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, max_num_batched_tokens=32)
    ids, want, top = reference[4]
    out = llm.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=K))[0]
    assert out.token_ids == [] and out.finish_reason == "length"
    _check(out, ids, want, top)
    assert llm.core.stats().num_free_blocks == llm.core.memory.num_blocks
    assert llm.core.stats().generation_tokens == 0


def test_rank_counts_the_likelier_tokens(smollm_fp32, hf_reference):
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32)
    ids = smollm_fp32.tokenizer.encode(PROMPTS[6])
    out = llm.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    with torch.inference_mode():
        lp = torch.log_softmax(hf_reference(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    want = (lp > lp.gather(1, torch.tensor(ids[1:])[:, None])).sum(-1) + 1
    got = [e.rank for e in out.prompt_logprobs[1:]]
    # ranks may differ where two logits are within float noise of each other: allow one off at a few
    assert sum(g != w for g, w in zip(got, want.tolist(), strict=True)) <= 2
    assert any(r > 1 for r in got) and any(r == 1 for r in got)


def test_max_tokens_zero_needs_prompt_logprobs_and_one_answer():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="n:"):
        SamplingParams(max_tokens=0, n=2, prompt_logprobs=0)
    assert SamplingParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
