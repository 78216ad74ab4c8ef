"""The whole-vocabulary draw's Triton kernel (kernels/sample_full.py), in Triton's interpreter, against its
twins: reference.sample_full_ref over the hashed noise, and the C++ draw (kernels/cpu_sample.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataplane.sampling.sampler import Sampler, SamplingBatch
from kernels import cpu_sample
from kernels.reference import sample_full_ref
from kernels.sample_full import sample_full
from kernels.seeded_noise import seeded_noise
from tests.kernels.sample_inputs import FULL_MIXES, ZERO_NOISE, full_inputs, top_p_batch


@pytest.mark.parametrize("rows,vocab", [(4, 49152), (24, 512), (12, 5000), (20, 37)])
@pytest.mark.parametrize("scale", [3.0, 1.0, 0.3])  # peaked, a nucleus of half the vocabulary, nearly flat
@pytest.mark.parametrize("mix", list(FULL_MIXES))
def test_the_kernel_draws_what_its_twins_draw(rows, vocab, scale, mix):
    """The same token as the reference's sort, softmax and race over the same hashed noise, and as the C++
    draw, whatever the nucleus (a few tokens, half the vocabulary, nearly all of it) and top-k (1 to the
    whole vocabulary, so from one round to many), with min-p, or nothing but a temperature."""
    for seed in range(2):
        inputs = full_inputs(rows, vocab, seed, scale)
        top_k, top_p, min_p = (inputs[name] if name else None for name in FULL_MIXES[mix])
        args = (inputs["logits"], inputs["temperature"], top_k, top_p, min_p, inputs["seeds"], inputs["index"])
        got = sample_full(*args)
        assert got.dtype == torch.int64 and got.shape == (rows,)
        want = sample_full_ref(*args[:5], seeded_noise(inputs["seeds"], inputs["index"], vocab))
        assert torch.equal(got, want), (seed, (got != want).nonzero().flatten().tolist())
        if cpu_sample.available():
            assert torch.equal(got, cpu_sample.sample_full(*args))


def test_small_top_k_on_a_flat_row_takes_many_rounds_and_stays_exact():
    """Top-k 3 of 5,000 nearly equal tokens: the first race's winner is almost never among the best 3, so
    the kernel narrows round after round (~log2(5000 / 3)); every draw is still one of the 3 and the twin's."""
    inputs = full_inputs(16, 5000, 5, 0.01)
    k = torch.full((16,), 3)
    args = (inputs["logits"], inputs["temperature"], k, None, None, inputs["seeds"], inputs["index"])
    got = sample_full(*args)
    best3 = inputs["logits"].topk(3, dim=-1).indices
    assert bool((best3 == got[:, None]).any(dim=-1).all())
    assert torch.equal(got, sample_full_ref(*args[:5], seeded_noise(inputs["seeds"], inputs["index"], 5000)))
    assert len(set((got[:, None] == best3).float().argmax(-1).tolist())) > 1  # not always the best


def test_ties_rank_the_lower_token_id_first():
    """Equal logits rank by token id, as in the C++ draw: top-k 1 takes the first of three tied tokens,
    top-k 2 draws only the first two."""
    logits = torch.zeros(64, 300)
    logits[:, [250, 17, 99]] = 5.0
    seeds, index = torch.arange(64), torch.zeros(64, dtype=torch.long)
    one = sample_full(logits, torch.ones(64), torch.ones(64, dtype=torch.long), None, None, seeds, index)
    assert set(one.tolist()) == {17}
    two = sample_full(logits, torch.ones(64), torch.full((64,), 2), None, None, seeds, index)
    assert set(two.tolist()) == {17, 99}
    if cpu_sample.available():
        assert torch.equal(two, cpu_sample.sample_full(logits, torch.ones(64), torch.full((64,), 2), None, None,
                                                       seeds, index))


def test_masked_and_broken_rows_draw_an_allowed_token_or_at_least_one_in_range():
    """Structured outputs mask disallowed tokens to -inf: only the allowed ones are drawn, with top-p and
    top-k on; a NaN row (a broken model) and an all -inf row still end (no endless narrowing) in range."""
    logits = torch.full((6, 700), -float("inf"))
    allowed = [5, 300, 699]
    logits[:4, allowed] = torch.tensor([1.0, 2.0, 0.5])
    logits[4] = float("nan")
    seeds = torch.arange(6) * 7
    seen = set()
    for i in range(40):
        ids = sample_full(logits, torch.ones(6), torch.full((6,), 40), torch.full((6,), 0.99), None, seeds,
                          torch.full((6,), i))
        seen |= set(ids[:4].tolist())
        assert bool(((ids >= 0) & (ids < 700)).all())
    assert seen == set(allowed)


def test_a_token_outside_the_nucleus_never_wins_on_zero_noise():
    """The witness of the old hash's zero noise (kernels/seeded_noise.py): the kernel hashes as the fixed
    hash does, so the masked token does not win."""
    seed, index, token = ZERO_NOISE
    logits = torch.full((1, 512), -5.0)
    logits[0, :3] = torch.tensor([4.0, 3.0, 2.0])  # the nucleus at top-p 0.9: tokens 0 and 1
    drawn = sample_full(logits, torch.ones(1), None, torch.tensor([0.9]), None, torch.tensor([seed]),
                        torch.tensor([index]))
    assert drawn.item() in (0, 1) and token not in (0, 1)


@pytest.mark.slow  # ~6 s each: 800 programs in the interpreter
@pytest.mark.parametrize("top_p,top_k,want", [(1.0, 0, [0.5, 0.3, 0.15, 0.05]), (0.8, 0, [0.625, 0.375, 0, 0]),
                                              (1.0, 3, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])])
def test_the_draws_keep_the_distribution(top_p, top_k, want):
    """Many rows (seeds) of one distribution: the softmax's frequencies, renormalized over what top-p or
    top-k keeps."""
    rows = 800
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])).repeat(rows, 1)
    drawn = sample_full(logits, torch.ones(rows), torch.full((rows,), top_k) if top_k else None,
                        torch.full((rows,), top_p) if top_p < 1 else None, None, torch.arange(rows) * 977 + 3,
                        torch.zeros(rows, dtype=torch.long))
    freq = torch.bincount(drawn, minlength=4).float() / rows
    assert torch.allclose(freq, torch.tensor(want), atol=0.055), freq  # 3.1 sigma at p = 0.5


@pytest.mark.parametrize("case,message", [
    ("double logits", "logits must have dtype"),
    ("3-d logits", "logits must have 2 dimensions"),
    ("temperature rows", "temperature must have shape"),
    ("int32 top_k", "top_k must have dtype"),
    ("seeds rows", "seeds must have shape"),
])
def test_bad_arguments_are_refused_before_launch(case, message):
    args = dict(logits=torch.randn(4, 100), temperature=torch.ones(4), top_k=torch.full((4,), 5), top_p=None,
                min_p=None, seeds=torch.arange(4), index=torch.zeros(4, dtype=torch.long))
    if case == "double logits":
        args["logits"] = args["logits"].double()
    elif case == "3-d logits":
        args["logits"] = args["logits"][None]
    elif case == "temperature rows":
        args["temperature"] = torch.ones(3)
    elif case == "int32 top_k":
        args["top_k"] = args["top_k"].int()
    elif case == "seeds rows":
        args["seeds"] = torch.arange(5)
    with pytest.raises(ValueError, match=message):
        sample_full(**args)
    assert sample_full(torch.zeros(0, 100), torch.ones(0), None, None, None, torch.zeros(0, dtype=torch.long),
                       torch.zeros(0, dtype=torch.long)).shape == (0,)


def test_the_sampler_draws_with_the_kernel_where_the_kernels_run(monkeypatch):
    """With the kernels on (TESSERA_KERNELS=triton, here in the interpreter) and no C++ draw, a batch with
    no top_k takes the kernel, one launch; from the same generator it draws the seeds the C++ path draws,
    so every row (seeded or not) gets the C++ path's token."""
    import kernels.sample_full as kernel_module

    torch.manual_seed(6)
    logits = torch.randn(16, 3000) * 2.0

    batch = top_p_batch

    want = Sampler(seed=9).sample_tensor(logits, batch())[0] if cpu_sample.available() else None
    calls = []
    monkeypatch.setattr(kernel_module, "sample_full", lambda *a: calls.append(1) or sample_full(*a))
    monkeypatch.setattr(cpu_sample, "available", lambda: False)
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    got = Sampler(seed=9).sample_tensor(logits, batch())[0]
    assert calls == [1]
    assert got[7].item() == logits[7].argmax().item()
    if want is not None:
        assert torch.equal(got, want)
    monkeypatch.setenv("TESSERA_KERNELS", "torch")  # the torch twin: seeded rows draw the same
    assert torch.equal(Sampler(seed=9).sample_tensor(logits, batch())[0][0::2], got[0::2])
    assert calls == [1]


def test_where_the_kernels_run_a_top_k_batch_is_one_launch_too(monkeypatch):
    """Every row with a small top_k (the candidates' plan: on the CPU the C++ draw among candidates) goes to
    the kernel where the kernels run, one launch; its seeded rows draw what the candidates' twin draws."""
    import kernels.sample_full as kernel_module

    torch.manual_seed(3)
    logits = torch.randn(12, 2000) * 2.0

    def batch() -> SamplingBatch:
        b = SamplingBatch(np.full(12, 0.8, dtype=np.float32), top_k=np.full(12, 40, dtype=np.int64),
                          top_p=np.full(12, 0.95, dtype=np.float32))
        b.seeds = np.where(np.arange(12) % 2 == 0, np.arange(12) * 11, -1).astype(np.int64)
        b.output_index = np.arange(12, dtype=np.int64) + 5
        return b

    calls = []
    monkeypatch.setattr(kernel_module, "sample_full", lambda *a: calls.append(1) or sample_full(*a))
    monkeypatch.setattr(cpu_sample, "available", lambda: False)
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    first = batch()
    got = Sampler(seed=4).sample_tensor(logits, first)[0]
    assert first.plan.candidates and calls == [1]
    top40 = logits.topk(40, dim=-1).indices
    assert bool((top40 == got[:, None]).any(dim=-1).all())
    monkeypatch.setenv("TESSERA_KERNELS", "torch")  # the candidates' torch twin
    twin = Sampler(seed=4).sample_tensor(logits, batch())[0]
    assert calls == [1]
    assert torch.equal(twin[0::2], got[0::2])
