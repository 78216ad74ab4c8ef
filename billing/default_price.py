"""The "Default list price": what a fresh install charges for every model until the operator prices it.

Without it a new install records every request unpriced (an error in the log, zeros in the export).
BILLING_DEFAULT_LIST_PRICE holds "input,cached_input,output" per 1M tokens; empty means no default.
Migration 0004 seeds it once, into an empty price book only: an install that already priced its models
never starts billing other models by surprise. It is an ordinary `*` entry, edited or closed in the admin.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.utils import timezone

from billing.errors import BillingError
from billing.money import PRICE_PLACES

DEFAULT_LIST_PRICE_NOTE = "Default list price (any model not priced by name): edit or close it in the admin"
RATE_FIELDS = ("input_per_mtok", "cached_input_per_mtok", "output_per_mtok")


def parse_default_list_price(text: str) -> dict[str, Decimal] | None:
    """ "0.10,0.05,0.20" -> the three rates; "" -> None. Refuses what price_create would refuse."""
    if not text.strip():
        return None
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != len(RATE_FIELDS):
        raise BillingError(f"BILLING_DEFAULT_LIST_PRICE needs input,cached_input,output per 1M tokens, got {text!r}")
    rates = {}
    for name, part in zip(RATE_FIELDS, parts, strict=True):
        try:
            value = Decimal(part)
        except InvalidOperation:
            raise BillingError(f"BILLING_DEFAULT_LIST_PRICE: {name} is not a number: {part!r}") from None
        if not value.is_finite() or value < 0 or value.as_tuple().exponent < -PRICE_PLACES:
            raise BillingError(f"BILLING_DEFAULT_LIST_PRICE: {name} must be >= 0 with at most {PRICE_PLACES} places")
        rates[name] = value
    return rates


def default_list_price_seed(price_model) -> object | None:
    """Create the default entry in an empty price book (`price_model`: the migration's historical Price)."""
    rates = parse_default_list_price(settings.BILLING_DEFAULT_LIST_PRICE)
    if rates is None or price_model.objects.exists():
        return None
    return price_model.objects.create(
        model="*", currency=settings.BILLING_DEFAULT_CURRENCY.lower(), effective_from=timezone.now(),
        note=DEFAULT_LIST_PRICE_NOTE, **rates)
