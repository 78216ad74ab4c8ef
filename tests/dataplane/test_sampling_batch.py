"""The batch sampler (sampling/sampler.py): the top-k candidate path against the whole-vocabulary path,
seeded noise as a hash, and a mixed batch against its rows sampled one at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataplane.sampling import plan as plan_mod
from dataplane.sampling.sampler import Sampler, SamplingBatch, SamplingRow
from dataplane.sampling_params import SamplingParams
from kernels.seeded_noise import seeded_noise, seeded_noise_at


def _batch(rows: int, *, top_k, top_p, min_p, seeded: bool) -> SamplingBatch:
    b = SamplingBatch(np.full(rows, 0.8, dtype=np.float32))
    b.top_k = np.asarray(top_k, dtype=np.int64) if top_k is not None else None
    b.top_p = np.asarray(top_p, dtype=np.float32) if top_p is not None else None
    b.min_p = np.asarray(min_p, dtype=np.float32) if min_p is not None else None
    if seeded:
        b.seeds = np.arange(rows, dtype=np.int64) * 17 + 3
        b.output_index = np.arange(rows, dtype=np.int64) % 5
    return b


@pytest.mark.parametrize("scale,top_k,top_p,min_p", [
    (3.0, [40] * 6, None, None),
    (3.0, [5, 40, 1, 12, 40, 7], [0.9, 0.5, 1.0, 0.95, 0.3, 0.8], None),
    (3.0, [40] * 6, [0.9] * 6, [0.1, 0.0, 0.3, 0.05, 0.0, 0.2]),
    # Flat logits: the top-k hold little of the mass, so top-p's mass must be the whole vocabulary's
    # (measured over the candidates alone it would cut where the full path does not).
    (0.3, [8] * 6, [0.05, 0.1, 0.02, 0.3, 0.01, 0.5], None),
])
def test_candidate_path_draws_what_the_whole_vocabulary_draws(monkeypatch, scale, top_k, top_p, min_p):
    """Seeded rows: the same noise at the same token ids, so both paths pick the same token, whatever
    top-k / top-p / min-p mix the rows carry."""
    torch.manual_seed(0)
    logits = torch.randn(6, 500) * scale
    for trial in range(12):
        batch = _batch(6, top_k=top_k, top_p=top_p, min_p=min_p, seeded=True)
        batch.output_index = batch.output_index + trial
        fast, _ = Sampler(seed=1).sample_tensor(logits, batch)
        assert batch.plan.candidates
        batch = _batch(6, top_k=top_k, top_p=top_p, min_p=min_p, seeded=True)  # a plan is made once per batch
        batch.output_index = batch.output_index + trial
        monkeypatch.setattr(plan_mod, "TOPK_CANDIDATES", 0)  # forces the sort of the whole vocabulary
        full, _ = Sampler(seed=1).sample_tensor(logits, batch)
        monkeypatch.setattr(plan_mod, "TOPK_CANDIDATES", 1024)
        assert not batch.plan.candidates
        assert fast.tolist() == full.tolist()


@pytest.mark.parametrize("top_k", [[40] * 6, None])
def test_a_batch_kept_across_steps_draws_what_fresh_batches_draw(top_k):
    """The runner keeps a decode step's SamplingBatch (and its plan, parameters on the device) from step
    to step, moving the seeded rows' output indices in place: each step draws what a batch built for it
    draws. Half the rows seeded, one greedy."""
    torch.manual_seed(3)
    logits = torch.randn(6, 300) * 2.0

    def batch():
        b = _batch(6, top_k=top_k, top_p=[0.9] * 6, min_p=None, seeded=True)
        b.temperature[2] = 0.0
        b.seeds[1::2] = -1
        return b

    kept = batch()
    kept_sampler, fresh_sampler = Sampler(seed=4), Sampler(seed=4)
    for step in range(6):
        np.add(kept.output_index, 1 if step else 0, out=kept.output_index)  # as SteadyDecodes.advance does
        got, _ = kept_sampler.sample_tensor(logits, kept)
        fresh = batch()
        fresh.output_index = fresh.output_index + step
        want, _ = fresh_sampler.sample_tensor(logits, fresh)
        assert got.tolist() == want.tolist(), step
    assert kept.plan is not None and len(kept.plan.seeded) == 2


def test_candidate_path_keeps_the_distribution():
    """Unseeded, top-k 3 of [0.5, 0.3, 0.15, 0.05]: frequencies of the renormalized top three."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    batch = SamplingBatch(np.ones(4000, dtype=np.float32), top_k=np.full(4000, 3, dtype=np.int64))
    tokens, _ = Sampler(seed=2).sample_tensor(logits, batch)
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, atol=0.03)
    assert freq[3] == 0


def test_seeded_noise_is_exponential_and_a_function_of_seed_index_and_token():
    n = seeded_noise(torch.tensor([1, 2]), torch.tensor([0, 0]), 40000)
    assert n.mean(1).sub(1).abs().max() < 0.03 and n.std(1).sub(1).abs().max() < 0.03
    assert not torch.equal(n[0], n[1])
    again = seeded_noise(torch.tensor([2]), torch.tensor([0]), 40000)
    assert torch.equal(again[0], n[1])  # its batch mate changed nothing
    ids = torch.tensor([[5, 17, 39999]])
    assert torch.equal(seeded_noise_at(torch.tensor([2]), torch.tensor([0]), ids)[0], n[1, [5, 17, 39999]])
    assert not torch.equal(seeded_noise(torch.tensor([2]), torch.tensor([1]), 40000)[0], n[1])  # next index


def test_a_mixed_batch_samples_each_row_as_it_would_alone():
    torch.manual_seed(1)
    logits = torch.randn(5, 300)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, seed=11, top_p=0.8),
              SamplingParams(temperature=1.1, seed=12, top_k=20, min_p=0.05),
              SamplingParams(temperature=0.0, logit_bias={7: 50.0}, logprobs=3),
              SamplingParams(temperature=0.9, seed=13, frequency_penalty=0.5, presence_penalty=0.2)]
    rows = [SamplingRow(p, [1, 2, 3, 7, 7], 3) for p in params]
    together, lps = Sampler(seed=5)(logits, rows)
    alone = [Sampler(seed=6)(logits[i : i + 1], [r])[0][0] for i, r in enumerate(rows)]
    assert together == alone
    assert together[3] == 7 and lps[3] is not None and len(lps[3].top) == 3
    assert together[0] == int(logits[0].argmax())
