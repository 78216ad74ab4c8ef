"""Verification of draft tokens: the longest prefix the target model would have produced itself.

The runner computes a speculating request's last known token and its k drafts d_1..d_k in one
forward pass, which gives the model's distribution p_j at each of the k + 1 positions (position j
conditioned on the drafts before it). Each row is sampled exactly as a plain decode would sample it
(penalties, temperature, top-k/p, min-p; the same per-request seeds, since a row's history includes
the drafts before it), giving t_0..t_k. The output is t_0..t_a, where a is the first j with
t_j != d_{j+1} (or k, the bonus token, when every draft matched).

This is rejection sampling for a deterministic draft (a point mass on d): t ~ p is accepted when
it equals d, with probability p(d) — the min(1, p(d) / q(d)) rule with q(d) = 1 — and on rejection
t is distributed as p restricted to tokens other than d, renormalized: exactly the residual
max(0, p - q) / (1 - p(d)). So the output's distribution is the target's, token by token, and a
greedy request's output is the one it would produce without drafts. A seeded request even produces
the same tokens (its noise depends on (seed, output index), not on the step that drew it).
"""

from __future__ import annotations


def accepted_tokens(drafts: list[int], sampled: list[int]) -> list[int]:
    """`sampled` holds the target's token at each of the len(drafts) + 1 positions; returns the tokens
    to emit: every matching draft, then the target's own token where they part (or the bonus)."""
    if len(sampled) != len(drafts) + 1:
        raise ValueError(f"sampled: expected {len(drafts) + 1} tokens for {len(drafts)} drafts, got {len(sampled)}")
    for j, draft in enumerate(drafts):
        if sampled[j] != draft:
            return sampled[: j + 1]
    return list(sampled)
