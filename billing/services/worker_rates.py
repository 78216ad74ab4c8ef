"""Worker-class rates: added, never edited, audited like prices (billing/services/prices.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from django.db import transaction

from billing.errors import BillingError
from billing.models import WorkerClassRate
from billing.money import PRICE_PLACES, ZERO_DECIMAL_CURRENCIES
from controlplane import audit

SPEED_PLACES = 4


def _decimal(name: str, value, *, places: int, positive: bool) -> Decimal:
    try:
        value = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise BillingError(f"{name} must be a decimal number, got {value!r}") from None
    if not value.is_finite() or value < 0 or (positive and value == 0):
        raise BillingError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value}")
    if value.as_tuple().exponent < -places:
        raise BillingError(f"{name} has more than {places} decimal places: {value}")
    return value


def _on_the_hour(name: str, value: datetime | None) -> None:
    if value is None:
        return
    if value.tzinfo is None:
        raise BillingError(f"{name} must be timezone-aware")
    # An hour is costed at one rate (billing/services/costs.py): a rate starting mid-hour would need two.
    # UTC's hours: an offset of half an hour (India's) makes a local "on the hour" a UTC half-hour.
    value = value.astimezone(UTC)
    if (value.minute, value.second, value.microsecond) != (0, 0, 0):
        raise BillingError(f"{name} must be on the hour, got {value.isoformat()}")


def worker_rate_check(
    *,
    worker_class: str,
    hourly_cost: Decimal,
    prefill_tokens_per_second: Decimal,
    decode_tokens_per_second: Decimal,
    effective_from: datetime,
    effective_to: datetime | None = None,
    currency: str = "usd",
    note: str = "",
) -> dict:
    """The rate's fields, checked and normalised (BillingError saying which and why); the admin's form
    calls it too, so it refuses what the service would."""
    worker_class = (worker_class or "").strip()
    if not worker_class or len(worker_class) > 128 or "\x00" in worker_class:
        raise BillingError("worker_class must be 1 to 128 characters")
    currency = (currency or "").strip().lower()
    if len(currency) != 3 or not currency.isalpha() or currency in ZERO_DECIMAL_CURRENCIES:
        raise BillingError(f"currency must be a three-letter code with cents, got {currency!r}")
    if effective_from is None:
        raise BillingError("effective_from is required")
    _on_the_hour("effective_from", effective_from)
    _on_the_hour("effective_to", effective_to)
    if effective_to is not None and effective_to <= effective_from:
        raise BillingError("effective_to must be after effective_from")
    return {
        "worker_class": worker_class, "currency": currency, "note": note or "",
        "effective_from": effective_from, "effective_to": effective_to,
        "hourly_cost": _decimal("hourly_cost", hourly_cost, places=PRICE_PLACES, positive=False),
        "prefill_tokens_per_second": _decimal("prefill_tokens_per_second", prefill_tokens_per_second,
                                              places=SPEED_PLACES, positive=True),
        "decode_tokens_per_second": _decimal("decode_tokens_per_second", decode_tokens_per_second,
                                             places=SPEED_PLACES, positive=True),
    }


def worker_rate_create(**fields) -> WorkerClassRate:
    """Add a rate for a worker class (fields: `worker_rate_check`'s). The class's open-ended rate that
    started earlier is closed at `effective_from` (a rate change); any other overlap is refused. Hours
    already costed keep their old cost until `cost_hour_rebuild` runs for them again."""
    fields = worker_rate_check(**fields)
    with transaction.atomic():
        to_close = worker_rate_window_check(worker_class=fields["worker_class"], effective_from=fields["effective_from"],
                                            effective_to=fields["effective_to"], lock=True)
        for other in to_close:
            with audit.change("worker_rate.close", other):
                other.effective_to = fields["effective_from"]
                other.save(update_fields=["effective_to"])
        rate = WorkerClassRate.objects.create(**fields)
        audit.record("worker_rate.create", rate)
        return rate


def worker_rate_window_check(*, worker_class: str, effective_from: datetime, effective_to: datetime | None,
                             lock: bool = False) -> list[WorkerClassRate]:
    """The open-ended rates a new window would close; raises if it overlaps anything else."""
    same_class = WorkerClassRate.objects.filter(worker_class=worker_class)
    if lock:
        same_class = same_class.select_for_update()
    to_close = []
    for other in same_class:
        overlaps = (other.effective_to is None or other.effective_to > effective_from) and (
            effective_to is None or effective_to > other.effective_from)
        if not overlaps:
            continue
        if other.effective_to is None and other.effective_from < effective_from:
            to_close.append(other)
            continue
        raise BillingError(f"rate window overlaps rate {other.pk} ({other})")
    return to_close


def worker_rate_at(*, worker_class: str, at: datetime) -> WorkerClassRate | None:
    """The class's rate in force at `at` (windows never overlap, so at most one)."""
    return (WorkerClassRate.objects.filter(worker_class=worker_class, effective_from__lte=at)
            .exclude(effective_to__lte=at).order_by("-effective_from").first())
