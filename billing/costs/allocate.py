"""Split an amount into parts proportional to weights so that the parts add up to it exactly.

Largest remainder (Hamilton): every part gets the floor of its exact share in units of `places`,
and the units left over go one each to the largest fractional remainders (ties to the earlier
part, so the result is deterministic). Exact arithmetic on `Fraction`s: no float, no context.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction


def allocate(total: Decimal, weights: Sequence[Decimal], *, places: int) -> list[Decimal]:
    """Parts of `total` (which must be a whole number of 10**-places) in proportion to `weights`.

    All-zero weights give everything to no one: that is the caller's decision (an hour with no work
    is all idle), so it is refused here rather than guessed.
    """
    if total < 0 or any(w < 0 for w in weights):
        raise ValueError("the total and the weights must be >= 0")
    unit = Decimal(1).scaleb(-places)
    units = Fraction(total) / Fraction(unit)
    if units.denominator != 1:
        raise ValueError(f"{total} is not a whole number of {unit}")
    weights_total = sum((Fraction(w) for w in weights), Fraction(0))
    if not weights:
        raise ValueError("nothing to allocate to")
    if weights_total == 0:
        raise ValueError("weights are all zero")
    whole = int(units)
    shares = [Fraction(whole) * Fraction(w) / weights_total for w in weights]
    floors = [s.numerator // s.denominator for s in shares]
    left = whole - sum(floors)
    # Largest remainder first; among equal remainders the earlier part (sorted is stable).
    order = sorted(range(len(shares)), key=lambda i: shares[i] - floors[i], reverse=True)
    for i in order[:left]:
        floors[i] += 1
    return [Decimal(n).scaleb(-places) for n in floors]
