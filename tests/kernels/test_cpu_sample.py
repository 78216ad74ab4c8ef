"""The C++ draws (kernels/cpu/sample_ops.cpp) against their twins, reference.sample_top_k_ref and
reference.sample_full_ref, and the sampler on either (dataplane/sampling/sampler.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataplane.sampling.sampler import Sampler, SamplingBatch
from kernels import cpu_sample
from kernels.reference import sample_full_ref, sample_top_k_ref, top_k_top_p_mask
from kernels.seeded_noise import seeded_noise
from tests.kernels.sample_inputs import FULL_MIXES, ZERO_NOISE, full_inputs, top_p_batch

pytestmark = pytest.mark.skipif(not cpu_sample.available(), reason="the C++ CPU kernels cannot be built here")


def _inputs(rows: int, vocab: int, k: int, seed: int, scale: float = 3.0) -> dict:
    g = torch.Generator().manual_seed(seed)
    seeded = torch.rand(rows, generator=g) < 0.5
    return {
        "logits": torch.randn(rows, vocab, generator=g) * scale,
        "temperature": torch.rand(rows, generator=g) + 0.3,
        "k": k,
        "top_k": torch.randint(1, k + 1, (rows,), generator=g),
        "top_p": torch.rand(rows, generator=g) * 0.9 + 0.1,
        "min_p": torch.rand(rows, generator=g) * 0.2,
        "noise": torch.empty(rows, k).exponential_(generator=g),
        "seeds": torch.where(seeded, torch.randint(0, 1 << 40, (rows,), generator=g), torch.full((rows,), -1)),
        "index": torch.randint(0, 1000, (rows,), generator=g),
    }


MIXES = {  # which of the optional parameters a batch carries
    "plain": (),
    "everything": ("top_k", "top_p", "min_p", "seeds"),
    "top_p, seeds": ("top_p", "seeds"),
    "ragged top_k, min_p": ("top_k", "min_p"),
}


def _call(fn, inputs: dict, mix: tuple[str, ...]) -> torch.Tensor:  # noqa: ANN001
    args = {name: (inputs[name] if name in mix or name in ("logits", "temperature", "k", "noise") else None)
            for name in ("logits", "temperature", "k", "top_k", "top_p", "min_p", "noise", "seeds")}
    args["index"] = inputs["index"] if "seeds" in mix else None
    return fn(**args)


@pytest.mark.parametrize("rows,vocab,k", [(256, 512, 40), (1, 512, 40), (16, 49152, 40), (40, 1000, 1000),
                                          (50, 100, 7), (20, 33, 33), (8, 64, 1)])
@pytest.mark.parametrize("mix", list(MIXES))
def test_the_kernel_draws_what_its_reference_draws(rows, vocab, k, mix):
    """Seeded rows hash the same noise at the same ids, unseeded rows take the same noise: the same token
    in every row, for every mix of top-k / top-p / min-p / seeds, vocabularies from 33 to 49,152, k from 1
    to the whole vocabulary."""
    for seed in range(3):
        inputs = _inputs(rows, vocab, k, seed)
        want = _call(sample_top_k_ref, inputs, MIXES[mix])
        got = _call(cpu_sample.sample_top_k, inputs, MIXES[mix])
        assert got.dtype == torch.int64 and got.shape == (rows,)
        assert torch.equal(got, want), (seed, (got != want).nonzero().flatten().tolist())


def test_other_dtypes_and_threads_draw_the_same():
    """Parameters in other dtypes (float64 temperatures, int32 top-k) are taken as the reference takes
    them; rows split across 2 threads draw what one thread draws."""
    inputs = _inputs(256, 512, 40, 11)
    want = _call(cpu_sample.sample_top_k, inputs, MIXES["everything"])
    other = dict(inputs, temperature=inputs["temperature"].double(), top_k=inputs["top_k"].int(),
                 top_p=inputs["top_p"].double(), index=inputs["index"].int())
    assert torch.equal(_call(cpu_sample.sample_top_k, other, MIXES["everything"]), want)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(_call(cpu_sample.sample_top_k, inputs, MIXES["everything"]), want)
    finally:
        torch.set_num_threads(threads)


def test_flat_logits_measure_top_p_over_the_whole_vocabulary():
    """Nearly flat logits: the 8 candidates hold ~2 % of the mass, so top-p 0.05 keeps all of them where a
    mass measured over the candidates alone would keep 1 or 2."""
    inputs = _inputs(64, 5000, 8, 7, scale=0.05)
    inputs["top_p"] = torch.full((64,), 0.05)
    want = _call(sample_top_k_ref, inputs, ("top_p",))
    got = _call(cpu_sample.sample_top_k, inputs, ("top_p",))
    assert torch.equal(got, want)
    assert len(set(got.tolist())) > 20  # not the best token of every row


def test_ties_rank_the_lower_token_id_first():
    """Equal logits: the lower id is the better candidate, so top-k 1 takes the first of them, and the
    same logits in another order give the same set of candidates."""
    logits = torch.zeros(3, 300)
    logits[:, [250, 17, 99]] = 5.0
    one = cpu_sample.sample_top_k(logits, torch.ones(3), 1, None, None, None, torch.ones(3, 1), None, None)
    assert one.tolist() == [17, 17, 17]
    draws = {cpu_sample.sample_top_k(logits, torch.ones(3), 3, None, None, None,
                                     torch.empty(3, 3).exponential_(), None, None)[0].item() for _ in range(200)}
    assert draws == {17, 99, 250}


def test_masked_rows_draw_only_allowed_tokens_even_with_fewer_than_k():
    """Structured outputs mask the disallowed tokens to -inf: a row with 3 allowed tokens and k 40 draws
    only those; NaN logits (a broken model) still give a token id in range, not a crash."""
    logits = torch.full((4, 700), -float("inf"))
    allowed = [5, 300, 699]
    logits[:3, allowed] = torch.tensor([1.0, 2.0, 0.5])
    logits[3] = float("nan")
    logits[3, 10] = 0.0
    seen = set()
    for i in range(100):
        noise = torch.empty(4, 40).exponential_()
        seeds = torch.tensor([-1, 3, -1, -1])
        ids = cpu_sample.sample_top_k(logits, torch.ones(4), 40, None, torch.full((4,), 0.99), None, noise, seeds,
                                      torch.full((4,), i))
        seen |= set(ids[:3].tolist())
        assert 0 <= ids[3].item() < 700
    assert seen == set(allowed)


def test_bad_inputs_are_refused_with_a_message():
    logits = torch.randn(4, 100)
    noise = torch.ones(4, 10)
    with pytest.raises(ValueError, match="float32 logits"):
        cpu_sample.sample_top_k(logits.double(), torch.ones(4), 10, None, None, None, noise, None, None)
    with pytest.raises(RuntimeError, match="k must be in"):
        cpu_sample.sample_top_k(logits, torch.ones(4), 101, None, None, None, torch.ones(4, 101), None, None)
    with pytest.raises(RuntimeError, match="noise must be"):
        cpu_sample.sample_top_k(logits, torch.ones(4), 10, None, None, None, torch.ones(4, 9), None, None)
    with pytest.raises(RuntimeError, match="top_k must be"):
        cpu_sample.sample_top_k(logits, torch.ones(4), 10, torch.ones(3, dtype=torch.long), None, None, noise,
                                None, None)
    with pytest.raises(RuntimeError, match="temperature must be"):
        cpu_sample.sample_top_k(logits, torch.ones(4, 1), 10, None, None, None, noise, None, None)
    with pytest.raises(RuntimeError, match="seeds and index"):
        cpu_sample.sample_top_k(logits, torch.ones(4), 10, None, None, None, noise, torch.zeros(4, dtype=torch.long),
                                None)


def _with_and_without_the_kernel(monkeypatch, logits: torch.Tensor, batch) -> list[torch.Tensor]:  # noqa: ANN001
    """Three steps' tokens from a sampler on the C++ draws; asserts a sampler on the torch twins (seeded
    alike) draws the same ones."""
    with_kernel, without = Sampler(seed=9), Sampler(seed=9)
    got = [with_kernel.sample_tensor(logits, batch())[0] for _ in range(3)]
    with monkeypatch.context() as m:
        m.setattr(cpu_sample, "available", lambda: False)
        want = [without.sample_tensor(logits, batch())[0] for _ in range(3)]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    return got


@pytest.mark.parametrize("every", [True, False])
def test_the_sampler_draws_the_same_with_or_without_the_kernel(monkeypatch, every):
    """A step's SamplingBatch (top-k 40 with top-p, half seeded, one greedy row when not `every`) through
    the sampler with the C++ draw and with the torch twin: the same tokens, and the generator left in the
    same state (the next unseeded draws agree too)."""
    torch.manual_seed(5)
    logits = torch.randn(32, 512) * 2.5

    def batch() -> SamplingBatch:
        b = SamplingBatch(np.full(32, 0.8, dtype=np.float32), top_k=np.full(32, 40, dtype=np.int64),
                          top_p=np.full(32, 0.95, dtype=np.float32))
        b.seeds = np.where(np.arange(32) % 2 == 0, np.arange(32) * 11, -1).astype(np.int64)
        b.output_index = np.arange(32, dtype=np.int64)
        if not every:
            b.temperature[3] = 0.0
        return b

    got = _with_and_without_the_kernel(monkeypatch, logits, batch)
    assert not torch.equal(got[0], got[1])  # unseeded rows move with the generator
    if not every:
        assert got[0][3].item() == logits[3].argmax().item()


@pytest.mark.parametrize("rows,vocab", [(8, 49152), (64, 512), (40, 5000), (20, 37)])
@pytest.mark.parametrize("scale", [3.0, 1.0, 0.3])  # peaked, a nucleus of half the vocabulary, nearly flat
@pytest.mark.parametrize("mix", list(FULL_MIXES))
def test_the_whole_vocabulary_draw_matches_its_reference(rows, vocab, scale, mix):
    """Every row's noise hashed at every token: the same token as the reference's sort, softmax and race,
    whether the nucleus is a few tokens (found among grown candidates) or most of the vocabulary (its
    floor found by bisection), with top-k of any size, min-p, or nothing but a temperature."""
    for seed in range(2):
        inputs = full_inputs(rows, vocab, seed, scale)
        top_k, top_p, min_p = (inputs[name] if name else None for name in FULL_MIXES[mix])
        args = (inputs["logits"], inputs["temperature"], top_k, top_p, min_p, inputs["seeds"], inputs["index"])
        noise = seeded_noise(inputs["seeds"], inputs["index"], vocab)
        got, want = cpu_sample.sample_full(*args), sample_full_ref(*args[:5], noise)
        assert torch.equal(got, want), (seed, (got != want).nonzero().flatten().tolist())


def test_a_seeded_row_draws_the_same_with_either_draw():
    """Which draw a batch takes depends on its other rows (candidates only when every row has a small
    top_k): a seeded row's token must not."""
    inputs = _inputs(32, 512, 40, 3)
    inputs["seeds"] = torch.randint(0, 1 << 40, (32,))
    mix = ("top_k", "top_p", "min_p", "seeds")
    among = _call(cpu_sample.sample_top_k, inputs, mix)
    full = cpu_sample.sample_full(inputs["logits"], inputs["temperature"], inputs["top_k"], inputs["top_p"],
                                  inputs["min_p"], inputs["seeds"], inputs["index"])
    assert torch.equal(among, full)


def test_seeded_noise_is_never_zero():
    seed, index, token = ZERO_NOISE
    noise = seeded_noise(torch.tensor([seed]), torch.tensor([index]), 512)[0]
    assert noise[token] > 0 and bool(torch.isfinite(noise).all())
    sweep = seeded_noise(torch.full((2048,), seed), torch.arange(2048) + 5000, 4096)
    assert sweep.min() > 0


@pytest.mark.parametrize("draw", ["reference", "c++"])
def test_a_token_outside_the_nucleus_never_wins_on_zero_noise(draw):
    """The old hash's zero noise at ZERO_NOISE's token made p / q NaN for a masked token, and argmax takes
    NaN for the largest: the request got a token top-p had dropped (one row in ~340 at 49,152 tokens)."""
    seed, index, token = ZERO_NOISE
    logits = torch.full((1, 512), -5.0)
    logits[0, :3] = torch.tensor([4.0, 3.0, 2.0])  # the nucleus at top-p 0.9: tokens 0 and 1
    args = (logits, torch.ones(1), None, torch.tensor([0.9]), None, torch.tensor([seed]), torch.tensor([index]))
    assert torch.isinf(top_k_top_p_mask(logits, None, torch.tensor([0.9]))[0, token])
    if draw == "reference":
        drawn = sample_full_ref(*args[:5], seeded_noise(args[5], args[6], 512))
    else:
        drawn = cpu_sample.sample_full(*args)
    assert drawn.item() in (0, 1)


@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_whole_vocabulary_draw_keeps_the_distribution(monkeypatch, top_p, kernel):
    """Unseeded rows through the sampler (on the C++ draw a fresh seed a step hashed into their noise; on
    the torch one Exp(1) drawn): the frequencies of the softmax, renormalized over the nucleus with top-p
    0.8 (0.5 + 0.3)."""
    if not kernel:
        monkeypatch.setattr(cpu_sample, "available", lambda: False)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.log(probs).repeat(4000, 1)
    batch = SamplingBatch(np.ones(4000, dtype=np.float32), top_p=np.full(4000, top_p, dtype=np.float32))
    tokens, _ = Sampler(seed=2).sample_tensor(logits, batch)
    assert not batch.plan.candidates
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    want = probs if top_p == 1.0 else torch.tensor([0.625, 0.375, 0.0, 0.0])
    assert torch.allclose(freq, want, atol=0.03), freq


def test_the_sampler_draws_the_same_over_the_vocabulary_with_or_without_the_kernel(monkeypatch):
    """No top_k (the whole-vocabulary draw): temperature-only and top-p rows, half seeded, one greedy. The
    C++ draw hashes an unseeded row's noise from a seed drawn each step, the torch one draws Exp(1) a
    token: seeded rows (and the greedy one) are the same either way."""
    torch.manual_seed(6)
    logits = torch.randn(16, 3000) * 2.0

    batch = top_p_batch

    with_kernel, without = Sampler(seed=9), Sampler(seed=9)
    got = [with_kernel.sample_tensor(logits, batch())[0] for _ in range(3)]
    with monkeypatch.context() as m:
        m.setattr(cpu_sample, "available", lambda: False)
        want = [without.sample_tensor(logits, batch())[0] for _ in range(3)]
    for g, w in zip(got, want, strict=True):  # seeded rows and the greedy one; the others' noise differs
        assert torch.equal(g[0::2], w[0::2]) and g[7] == w[7]
    assert not torch.equal(got[0][1::2], got[1][1::2])  # unseeded rows move with the generator
    assert torch.equal(got[0][0::2], got[1][0::2])  # seeded ones do not (same output index)
    assert got[0][7].item() == logits[7].argmax().item()
