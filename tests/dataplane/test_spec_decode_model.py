"""Speculative decoding through the engine: the same outputs as without it (real SmolLM2), and the
same output distribution when sampling (a small random model, chi-square with a fixed seed)."""

from __future__ import annotations

import collections

import pytest
import torch

from dataplane.engine.llm import LLM
from dataplane.sampling_params import SamplingParams
from tests.dataplane.conftest import MODEL
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors

TEXT = ("Tessera serves many tenants from one pool of workers. The gateway checks each key, applies the "
        "tenant's limits and streams the answer back, while the engine batches every request it holds.")
PROMPT = f"Repeat this text exactly.\nText: {TEXT}\nRepeated text:"


@pytest.mark.slow
@pytest.mark.model
def test_outputs_are_the_same_with_and_without_speculation(smollm_fp32):
    # One engine run: each request twice, without drafts and with up to 4, verified beside plain decodes.
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, speculative_ngram_tokens=4, speculative_max_running=6)
    params = [SamplingParams(max_tokens=32, temperature=0, logprobs=2),
              SamplingParams(max_tokens=20, temperature=0.8, seed=7),  # seeded: the same noise per token
              SamplingParams(max_tokens=32, temperature=0, stop=["tenant's limits"])]
    outs = llm.generate([PROMPT] * 6, [_with(p, speculative_tokens=k) for k in (0, 4) for p in params])
    plain, spec = outs[:3], outs[3:]
    stats = llm.core.stats()
    assert stats.spec_num_accepted_tokens >= 20, stats  # the copy is mostly accepted drafts
    for a, b in zip(plain, spec, strict=True):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert b.outputs[0].text == a.outputs[0].text
        assert b.outputs[0].finish_reason == a.outputs[0].finish_reason
    assert spec[2].outputs[0].finish_reason == "stop" and spec[2].outputs[0].text.endswith("applies the ")
    for x, y in zip(plain[0].outputs[0].logprobs, spec[0].outputs[0].logprobs, strict=True):
        assert x.token_id == y.token_id and [t for t, _ in x.top] == [t for t, _ in y.top]
        assert y.logprob == pytest.approx(x.logprob, abs=1e-3)


def _with(params: SamplingParams, **changes: object) -> SamplingParams:
    return SamplingParams(**{**{f: getattr(params, f) for f in SamplingParams.__dataclass_fields__}, **changes})


def _chi_square_p(table: list[list[int]]) -> float:
    """p-value of Pearson's test that the rows (samples) come from one distribution."""
    t = torch.tensor(table, dtype=torch.float64)
    expected = t.sum(1, keepdim=True) * t.sum(0, keepdim=True) / t.sum()
    stat = ((t - expected) ** 2 / expected).sum()
    dof = (t.shape[0] - 1) * (t.shape[1] - 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def test_sampled_distribution_is_unchanged_by_speculation():
    args = tiny_args()
    model = loaded(args, tiny_tensors(args))
    prompt = [5, 6] * 8 + [5]  # the n-gram drafts alternate 6, 5, 6, ...
    params = SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True, logit_bias={5: 7.0, 6: 7.0})
    n = 1000
    samples, stats = [], None
    for k, seed in ((0, 11), (3, 12)):
        llm = LLM("tiny", dtype="float32", preloaded=model, seed=seed, speculative_ngram_tokens=k,
                  speculative_max_running=n, max_num_seqs=n, max_num_batched_tokens=4 * n, block_size=8,
                  kv_cache_memory="32MiB")
        outs = llm.generate([prompt] * n, params)
        # Tokens 2-4 are the speculated ones (the first comes from the prompt's chunk): their joint law,
        # with tokens other than 5 and 6 pooled.
        samples.append(collections.Counter(tuple(t if t in (5, 6) else 0 for t in o.outputs[0].token_ids[1:])
                                           for o in outs))
        stats = llm.core.stats()
    rate = stats.spec_num_accepted_tokens / stats.spec_num_draft_tokens
    assert 0.2 < rate < 0.8, rate  # both branches (accept, and reject then resample) are exercised
    keys = [key for key in samples[0] | samples[1] if samples[0][key] + samples[1][key] >= 10]
    table = [[s[key] for key in keys] + [sum(s.values()) - sum(s[key] for key in keys)] for s in samples]
    if table[0][-1] + table[1][-1] == 0:
        table = [row[:-1] for row in table]
    assert len(keys) >= 8
    p = _chi_square_p(table)
    print(f'p={p:.3f} acceptance={rate:.2f} categories={len(table[0])}')
    assert p > 0.001, (p, table)


def test_lora_requests_speculate_with_the_same_outputs(tmp_path):
    from tests.dataplane.lora_helpers import write_adapter

    args = tiny_args()
    write_adapter(tmp_path / "a", args, rank=4, targets=("q_proj", "v_proj", "down_proj"))
    llm = LLM("tiny", dtype="float32", preloaded=loaded(args, tiny_tensors(args)), enable_lora=True, block_size=8,
              kv_cache_memory="16MiB")
    llm.add_adapter("a", str(tmp_path / "a"))
    prompt = [5, 6, 7, 8] * 4 + [5]
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, speculative_tokens=k) for k in (0, 3)]
    outs = llm.generate([prompt] * 4, params * 2, adapters=["a", "a", None, None])
    assert llm.core.stats().spec_num_drafts > 0
    assert outs[1].outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert outs[3].outputs[0].token_ids == outs[2].outputs[0].token_ids
    assert outs[0].outputs[0].token_ids != outs[2].outputs[0].token_ids  # the adapter changes the answer
