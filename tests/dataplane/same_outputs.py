"""Two engine runs that must not differ (overlapped vs synchronous steps, kept vs rebuilt decode steps):
a mixed workload and the comparison of its outputs."""

from __future__ import annotations

import pytest

from dataplane import SamplingParams


def mixed_params(i: int, length: int) -> SamplingParams:
    """The i-th request's parameters, cycling greedy with logprobs, seeded top-p, seeded top-k with stop
    tokens and greedy n=2; `length` sets its max_tokens."""
    if i % 4 == 0:
        return SamplingParams(max_tokens=length, temperature=0.0, logprobs=2)  # EOS may end it
    if i % 4 == 1:
        return SamplingParams(max_tokens=length, temperature=0.8, top_p=0.9, seed=i, ignore_eos=True, logprobs=0)
    if i % 4 == 2:
        return SamplingParams(max_tokens=length, temperature=1.0, top_k=8, seed=40 + i, stop_token_ids=[7, 9])
    return SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True, n=2)


def assert_same_outputs(a, b, *, text: bool = True) -> None:  # noqa: ANN001 - lists of RequestOutput
    """Same tokens, finish and stop reasons, cached tokens (and text), logprobs and their top ids."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.num_cached_tokens == y.num_cached_tokens
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            assert (cy.token_ids, cy.finish_reason, cy.stop_reason) == (cx.token_ids, cx.finish_reason, cx.stop_reason)
            if text:
                assert cy.text == cx.text
            if cx.logprobs is not None:
                for lx, ly in zip(cx.logprobs, cy.logprobs, strict=True):
                    assert ly.token_id == lx.token_id and ly.logprob == pytest.approx(lx.logprob, abs=1e-6)
                    assert [t for t, _ in ly.top] == [t for t, _ in lx.top]
