"""One replica-hour's cost, split between the requests it served and idle. Pure: no database.

The weighting is the engine's step-cost model (dataplane/scheduler/step_cost.py: a step takes
a + b x tokens) reduced to two speeds per worker class, prompt and output tokens per second at a
full batch: a request's work is `prefill / prefill_tps + decode / decode_tps` seconds. Cached prompt
tokens are not computed by the engine (prefix cache) and weigh nothing. The hour's cost is
`up hours x rate`, rounded to the cent once; the requests get shares of it by their work, and what
their work did not fill of the replica's time is idle. When the work adds up to more than the time
(the speeds are set too low for this load) the requests share the whole hour and idle is zero.

docs/economics.md says why this model and not measured step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Context, Decimal, localcontext
from fractions import Fraction

from billing.costs.allocate import allocate
from billing.models.costs import COST_PLACES, SECONDS_PLACES
from billing.money import AMOUNT_PLACES, CENT, ZERO

SECONDS_PER_HOUR = 3600
_EXACT = Context(prec=80)  # as billing.money: products and quotients never round before we say so


@dataclass(frozen=True, slots=True)
class Speeds:
    prefill_tokens_per_second: Decimal  # prompt tokens computed per second at a full batch
    decode_tokens_per_second: Decimal  # output tokens generated per second at a full batch


@dataclass(frozen=True, slots=True)
class RequestWork:
    key: int  # the usage record's id
    prefill_tokens: int  # prompt tokens the engine computed (cached ones excluded)
    decode_tokens: int  # completion tokens


@dataclass(frozen=True, slots=True)
class RequestShare:
    key: int  # the usage record's id
    prefill_seconds: Decimal  # work, rounded to the microsecond for display (shares use the exact value)
    decode_seconds: Decimal
    cost: Decimal  # its share of the hour's cost, to the micro-unit
    input_cost: Decimal  # the part of `cost` its prefill work took (exact: input + output = cost)
    output_cost: Decimal


@dataclass(frozen=True, slots=True)
class ReplicaHourSplit:
    up_seconds: Decimal  # the replica's ready time in this hour
    work_seconds: Decimal  # the requests' work as the speeds price it (may exceed up_seconds)
    busy_seconds: Decimal  # min(work, up): the part of up_seconds that was not idle
    total_cost: Decimal  # up hours x rate, rounded to the cent
    attributed_cost: Decimal  # sum of the shares' costs
    idle_cost: Decimal  # total_cost - attributed_cost, exactly
    shares: list[RequestShare]


def kind_of(*, batch_id: str, embeddings: bool) -> str:
    """The traffic line a request belongs to in the report (batch and embeddings are costed alike)."""
    if batch_id:
        return "batch-embeddings" if embeddings else "batch"
    return "embeddings" if embeddings else "online"


def hour_cost(*, up_seconds: Decimal, hourly_cost: Decimal) -> Decimal:
    """up hours x rate, rounded half-up to the cent (the one rounding of a replica-hour)."""
    with localcontext(_EXACT):
        return (up_seconds * hourly_cost / SECONDS_PER_HOUR).quantize(CENT, rounding=ROUND_HALF_UP)


def _seconds(value: Fraction) -> Decimal:
    with localcontext(_EXACT):
        exact = Decimal(value.numerator) / Decimal(value.denominator)
        return exact.quantize(Decimal(1).scaleb(-SECONDS_PLACES), rounding=ROUND_HALF_EVEN)


def replica_hour_split(*, up_seconds: Decimal, hourly_cost: Decimal | None, speeds: Speeds | None,
                       requests: Sequence[RequestWork]) -> ReplicaHourSplit:
    """Split one replica-hour. `hourly_cost` None (the class has no rate): everything costs zero."""
    if up_seconds < 0:
        raise ValueError(f"up_seconds must be >= 0, got {up_seconds}")
    if hourly_cost is None or speeds is None:
        shares = [RequestShare(r.key, ZERO, ZERO, ZERO, ZERO, ZERO) for r in requests]
        return ReplicaHourSplit(up_seconds, ZERO, ZERO, ZERO, ZERO, ZERO, shares)
    prefill = [Fraction(r.prefill_tokens) / Fraction(speeds.prefill_tokens_per_second) for r in requests]
    decode = [Fraction(r.decode_tokens) / Fraction(speeds.decode_tokens_per_second) for r in requests]
    work = [p + d for p, d in zip(prefill, decode, strict=True)]
    total_work = sum(work, Fraction(0))
    up = Fraction(up_seconds)
    idle_seconds = max(up - total_work, Fraction(0))
    total = hour_cost(up_seconds=up_seconds, hourly_cost=hourly_cost)
    weights = [*work, idle_seconds]
    if total == 0:  # a zero rate, or no time up (then no idle either): nothing to share
        parts = [ZERO] * len(weights)
    else:  # up > 0, so the weights are not all zero: idle > 0 unless the work fills the hour
        parts = allocate(total, weights, places=COST_PLACES)
    shares = []
    for request, p, d, w, cost in zip(requests, prefill, decode, work, parts, strict=False):
        with localcontext(_EXACT):
            input_cost = ZERO if w == 0 else (cost * Decimal(p.numerator) * Decimal(w.denominator)
                                              / (Decimal(p.denominator) * Decimal(w.numerator)))
            input_cost = input_cost.quantize(Decimal(1).scaleb(-AMOUNT_PLACES), rounding=ROUND_HALF_EVEN)
        shares.append(RequestShare(request.key, _seconds(p), _seconds(d), cost, input_cost, cost - input_cost))
    attributed = sum((s.cost for s in shares), ZERO)
    return ReplicaHourSplit(
        up_seconds=up_seconds, work_seconds=_seconds(total_work), busy_seconds=_seconds(min(total_work, up)),
        total_cost=total, attributed_cost=attributed, idle_cost=parts[-1], shares=shares,
    )
