from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction

from billing.errors import BillingError
from billing.models import Price
from billing.money import PRICE_PLACES
from controlplane import audit


def _check_rate(name: str, value: Decimal) -> Decimal:
    value = Decimal(value)
    if value < 0:
        raise BillingError(f"{name} must be >= 0, got {value}")
    if value.as_tuple().exponent < -PRICE_PLACES:
        raise BillingError(f"{name} has more than {PRICE_PLACES} decimal places: {value}")
    return value


def price_create(
    *,
    model: str,
    input_per_mtok: Decimal,
    cached_input_per_mtok: Decimal,
    output_per_mtok: Decimal,
    effective_from: datetime,
    effective_to: datetime | None = None,
    adapter: str = "",
    tier: str = "",
    currency: str = "usd",
    note: str = "",
    batch_percent: Decimal | None = None,
    embedding_input_per_mtok: Decimal | None = None,
) -> Price:
    """Add a rate card entry. An open-ended entry for the same scope that started earlier is closed at
    `effective_from` (that is how a price changes); any other overlap is refused.

    Usage already written keeps the price it was written with (pricing happens at write time).
    """
    if effective_from.tzinfo is None or (effective_to is not None and effective_to.tzinfo is None):
        raise BillingError("effective_from / effective_to must be timezone-aware")
    if effective_to is not None and effective_to <= effective_from:
        raise BillingError("effective_to must be after effective_from")
    rates = {
        name: _check_rate(name, value)
        for name, value in (
            ("input_per_mtok", input_per_mtok),
            ("cached_input_per_mtok", cached_input_per_mtok),
            ("output_per_mtok", output_per_mtok),
        )
    }
    if embedding_input_per_mtok is not None:  # /v1/embeddings input; None: at the input rate
        rates["embedding_input_per_mtok"] = _check_rate("embedding_input_per_mtok", embedding_input_per_mtok)
    scope = {"model": model, "adapter": adapter or "", "tier": tier or ""}
    if batch_percent is not None:  # the batch line's share of these rates (Price.batch_percent's default else)
        if not Decimal(0) <= batch_percent <= Decimal(100):
            raise BillingError(f"batch_percent must be from 0 to 100, got {batch_percent}")
        rates["batch_percent"] = batch_percent
    with transaction.atomic():
        to_close = price_window_check(**scope, effective_from=effective_from, effective_to=effective_to, lock=True)
        for other in to_close:
            with audit.change("price.close", other):
                other.effective_to = effective_from
                other.save(update_fields=["effective_to"])
        price = Price.objects.create(
            **scope, **rates, currency=currency.lower(), effective_from=effective_from, effective_to=effective_to, note=note
        )
        audit.record("price.create", price)
        return price


def price_window_check(
    *, model: str, adapter: str, tier: str, effective_from: datetime, effective_to: datetime | None, lock: bool = False
) -> list[Price]:
    """The open-ended prices a new window would close; raises if it overlaps anything else."""
    same_scope = Price.objects.filter(model=model, adapter=adapter or "", tier=tier or "")
    if lock:
        same_scope = same_scope.select_for_update()
    to_close = []
    for other in same_scope:
        overlaps = (other.effective_to is None or other.effective_to > effective_from) and (
            effective_to is None or effective_to > other.effective_from
        )
        if not overlaps:
            continue
        if other.effective_to is None and other.effective_from < effective_from:
            to_close.append(other)
            continue
        raise BillingError(f"price window overlaps price {other.pk} ({other})")
    return to_close
