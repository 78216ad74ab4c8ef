"""Greedy sequences compared token by token, with their logprobs: the GPU check's correctness measure.

Used two ways: the CUDA engine against the CPU path (float32), and the engine with CUDA graphs against
itself without them (float32 and bfloat16). Greedy tokens must agree; the sampled tokens' logprobs and
the shared top alternatives within a tolerance. A divergence where the reference's two best tokens are
within the tie tolerance is a near-tie: reported, not a failure (any change of summation order may flip
it, and after it the sequences are no longer comparable).
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.scheduler.output import TokenLogprobs

LOGPROB_TOL = 2e-3  # float32 on both sides: only summation order differs (~1e-5 seen on CPU thread counts)
TIE_TOL = 1e-2  # a greedy pick between two tokens this close may flip on any summation order
# bfloat16, graphs against eager: a padded graph step multiplies at another batch size than the eager one,
# so GEMMs may sum in another order and round to bfloat16 differently; judged at the kernels' bf16
# tolerance (3e-2 absolute, tests/kernels/helpers.py), for logprobs and for near-ties alike.
BF16_LOGPROB_TOL = 3e-2
TOLERANCES = {"float32": (LOGPROB_TOL, TIE_TOL), "bfloat16": (BF16_LOGPROB_TOL, BF16_LOGPROB_TOL),
              "float16": (BF16_LOGPROB_TOL, BF16_LOGPROB_TOL)}


@dataclass(slots=True)
class SequenceCheck:
    prompt: int
    compared: int  # tokens compared before the end or a near-tie divergence
    max_logprob_err: float
    diverged_at: int | None  # first differing position, or None
    near_tie: bool  # the divergence is explained by a near-tie on the reference side
    ok: bool


def compare_sequences(index: int, ref: list[TokenLogprobs], got: list[TokenLogprobs],
                      logprob_tol: float = LOGPROB_TOL, tie_tol: float = TIE_TOL) -> SequenceCheck:
    """Greedy tokens must agree; logprobs of the sampled token and of shared alternatives within tol."""
    worst = 0.0
    for pos, (c, g) in enumerate(zip(ref, got, strict=False)):
        if c.token_id != g.token_id:
            alt = dict(c.top).get(g.token_id)
            tie = alt is not None and c.logprob - alt <= tie_tol
            return SequenceCheck(index, pos, worst, pos, tie, tie and worst <= logprob_tol)
        worst = max(worst, abs(c.logprob - g.logprob))
        g_top = dict(g.top)
        worst = max([worst] + [abs(lp - g_top[t]) for t, lp in c.top if t in g_top])
    same_length = len(ref) == len(got)
    return SequenceCheck(index, min(len(ref), len(got)), worst, None if same_length else min(len(ref), len(got)),
                         False, same_length and worst <= logprob_tol)


def compare_outputs(ref: list, got: list, dtype: str) -> list[SequenceCheck]:
    """RequestOutputs of the same prompts (with logprobs), at `dtype`'s tolerances."""
    tol, tie = TOLERANCES[dtype]
    return [compare_sequences(i, r.outputs[0].logprobs or [], g.outputs[0].logprobs or [], tol, tie)
            for i, (r, g) in enumerate(zip(ref, got, strict=True))]


def vars_of(obj: object) -> dict:
    return {f: getattr(obj, f) for f in obj.__slots__}  # type: ignore[attr-defined]
