from __future__ import annotations

import logging
from datetime import UTC, date, datetime, time
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import signals
from billing.errors import BillingError, InvoiceStateError
from billing.models import Invoice, InvoiceLine, Price, UsageRecord
from billing.money import (
    METER_RATE_FIELD,
    METERS,
    MONEY_PLACES,
    exact_sum,
    round_money,
    rounding_rule,
    token_cost,
)
from billing.selectors import usage_meter_totals_by_price
from controlplane import audit

logger = logging.getLogger("tessera.billing")
# What an invoice's audit events show: its state and money, not the Stripe sync bookkeeping.
AUDITED_INVOICE_FIELDS = ("status", "number", "total", "currency", "finalized_at", "paid_at", "voided_at", "void_reason")
METER_LABELS = {"input": "input tokens", "cached_input": "cached input tokens", "output": "output tokens"}


def month_bounds(month: date) -> tuple[date, date]:
    start = month.replace(day=1)
    end = date(start.year + (start.month == 12), start.month % 12 + 1, 1)
    return start, end


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _default_currency() -> str:
    return getattr(settings, "BILLING_DEFAULT_CURRENCY", "usd")


def _live_invoice_for_update(*, tenant_id: int, period_start: date, currency: str) -> Invoice:
    """The month's non-void invoice, locked; created as a draft if there is none (race-safe)."""
    live = Invoice.objects.select_for_update().exclude(status=Invoice.Status.VOID)
    key = {"tenant_id": tenant_id, "period_start": period_start, "currency": currency}
    invoice = live.filter(**key).first()
    if invoice is not None:
        return invoice
    try:
        with transaction.atomic():
            Invoice.objects.create(
                **key, period_end=month_bounds(period_start)[1], status=Invoice.Status.DRAFT, rounding=rounding_rule()
            )
    except IntegrityError:
        pass  # a concurrent build created it; the unique constraint on live invoices guarantees one
    return live.get(**key)


def _attach_unbilled_usage(invoice: Invoice) -> None:
    """Give the draft every unbilled record of its month, plus late records of months already closed."""
    unbilled = UsageRecord.objects.filter(
        tenant_id=invoice.tenant_id, currency=invoice.currency, invoice__isnull=True,
        created_at__lt=_midnight(invoice.period_end),
    )
    earlier_draft = Invoice.objects.filter(
        tenant_id=invoice.tenant_id, currency=invoice.currency, status=Invoice.Status.DRAFT,
        period_start__lt=invoice.period_start,
    ).exists()
    if earlier_draft:  # that draft will take its own month's records when it is built
        unbilled = unbilled.filter(created_at__gte=_midnight(invoice.period_start))
    unbilled.update(invoice=invoice)


def _line_description(model: str, adapter: str, meter: str, rate: Decimal, currency: str) -> str:
    scope = f"{model} + {adapter}" if adapter else model
    return f"{scope}: {METER_LABELS[meter]} @ {rate.normalize():f} {currency.upper()} / 1M"


def _rebuild_usage_lines(invoice: Invoice) -> None:
    """Usage lines = Σ tokens per (price, model, adapter, meter) × rate, each rounded once to cents."""
    invoice.lines.filter(kind=InvoiceLine.Kind.USAGE).delete()
    groups = usage_meter_totals_by_price(invoice.usage_records.filter(price__isnull=False), "model", "adapter")
    prices = Price.objects.in_bulk({g["price_id"] for g in groups})
    lines = []
    for group in sorted(groups, key=lambda g: (g["model"], g["adapter"], g["price_id"], g["batch"], g["embeddings"])):
        price = prices[group["price_id"]]
        for meter in METERS:
            quantity = group[meter] or 0
            if quantity == 0:
                continue
            rate = price.rate(METER_RATE_FIELD[meter], batch=group["batch"], embeddings=group["embeddings"])
            exact = token_cost(quantity, rate)
            lines.append(InvoiceLine(
                invoice=invoice, kind=InvoiceLine.Kind.USAGE, price=price, model=group["model"],
                adapter=group["adapter"], meter=meter, quantity=quantity, unit_price=rate,
                exact_amount=exact, amount=round_money(exact, invoice.rounding),
                description=_line_description(group["model"], group["adapter"], meter, rate, invoice.currency)
                + (" (batch)" if group["batch"] else "") + (" (embeddings)" if group["embeddings"] else ""),
            ))
    InvoiceLine.objects.bulk_create(lines)


def _refresh_total(invoice: Invoice) -> None:
    invoice.total = exact_sum(invoice.lines.values_list("amount", flat=True))
    invoice.save(update_fields=["total", "rounding", "updated_at"])


def _rebuild_draft(invoice: Invoice) -> Invoice:
    if invoice.status != Invoice.Status.DRAFT:
        raise InvoiceStateError(f"invoice {invoice} is {invoice.status}; only drafts change")
    invoice.rounding = rounding_rule()
    _attach_unbilled_usage(invoice)
    _rebuild_usage_lines(invoice)
    _refresh_total(invoice)
    return invoice


def invoice_draft_build(*, tenant, month: date, currency: str | None = None) -> Invoice:
    """Create or refresh the tenant's draft for `month`: attach unbilled usage, recompute usage lines
    (credits and adjustments are kept), total = Σ lines. Refuses on a finalized invoice."""
    period_start = month_bounds(month)[0]
    with transaction.atomic():
        invoice = _live_invoice_for_update(
            tenant_id=getattr(tenant, "pk", tenant), period_start=period_start, currency=currency or _default_currency()
        )
        return _rebuild_draft(invoice)


def _locked(invoice: Invoice | int) -> Invoice:
    return Invoice.objects.select_for_update().get(pk=getattr(invoice, "pk", invoice))


def invoice_line_add(*, invoice: Invoice | int, kind: str, description: str, amount: Decimal) -> InvoiceLine:
    """Add an explicit credit (negative) or adjustment (either sign) line to a draft, in cents."""
    amount = Decimal(amount)
    if kind not in (InvoiceLine.Kind.CREDIT, InvoiceLine.Kind.ADJUSTMENT):
        raise BillingError(f"only credit or adjustment lines are added by hand, not {kind!r}")
    if amount.as_tuple().exponent < -MONEY_PLACES:
        raise BillingError(f"{amount} has more than {MONEY_PLACES} decimal places; amounts on lines are in cents")
    if kind == InvoiceLine.Kind.CREDIT and amount >= 0:
        raise BillingError("a credit is a negative amount")
    with transaction.atomic():
        locked = _locked(invoice)
        if locked.status != Invoice.Status.DRAFT:
            raise InvoiceStateError(f"invoice {locked} is {locked.status}; only drafts change")
        line = InvoiceLine.objects.create(
            invoice=locked, kind=kind, description=description, exact_amount=amount, amount=amount
        )
        _refresh_total(locked)
        audit.record("invoice.line_add", line, tenant_id=locked.tenant_id)
    return line


def invoice_finalize(*, invoice: Invoice | int) -> Invoice:
    """Rebuild the draft one last time, then freeze it. Refuses while any of its usage has no price."""
    with transaction.atomic():
        locked = _rebuild_draft(_locked(invoice))
        unpriced = locked.usage_records.filter(price__isnull=True).count()
        if unpriced:
            raise BillingError(f"{unpriced} usage records on {locked} have no price; add one and reprice first")
        with audit.change("invoice.finalize", locked, fields=AUDITED_INVOICE_FIELDS):
            locked.status = Invoice.Status.FINALIZED
            locked.finalized_at = timezone.now()
            locked.number = f"TSR-{locked.period_start:%Y%m}-{locked.tenant_id}-{locked.pk}"
            locked.save(update_fields=["status", "finalized_at", "number", "updated_at"])
        transaction.on_commit(lambda: _want_stripe_push("sync", locked.pk))
    return locked


def invoice_mark_paid(*, invoice: Invoice | int, paid_at: datetime | None = None) -> Invoice:
    with transaction.atomic():
        locked = _locked(invoice)
        if locked.status == Invoice.Status.PAID:
            return locked
        if locked.status != Invoice.Status.FINALIZED:
            raise InvoiceStateError(f"invoice {locked} is {locked.status}; only finalized invoices get paid")
        with audit.change("invoice.mark_paid", locked, fields=AUDITED_INVOICE_FIELDS):
            locked.status, locked.paid_at = Invoice.Status.PAID, paid_at or timezone.now()
            locked.save(update_fields=["status", "paid_at", "updated_at"])
    return locked


def invoice_void(*, invoice: Invoice | int, reason: str = "", from_stripe: bool = False) -> Invoice:
    """Void a draft or finalized invoice and release its usage so a corrected invoice can bill it."""
    with transaction.atomic():
        locked = _locked(invoice)
        if locked.status == Invoice.Status.VOID:
            return locked
        if locked.status == Invoice.Status.PAID:
            raise InvoiceStateError(f"invoice {locked} is paid; refund it instead of voiding")
        with audit.change("invoice.void", locked, fields=AUDITED_INVOICE_FIELDS):
            locked.usage_records.update(invoice=None)
            locked.status, locked.voided_at, locked.void_reason = Invoice.Status.VOID, timezone.now(), reason[:200]
            locked.save(update_fields=["status", "voided_at", "void_reason", "updated_at"])
        if locked.stripe_invoice_id and not from_stripe:
            transaction.on_commit(lambda: _want_stripe_push("void", locked.pk))
    return locked


def invoices_build_month(*, month: date, finalize: bool = False) -> list[int]:
    """Draft (and optionally finalize) the month's invoice of every tenant with usage to bill."""
    period_start, period_end = month_bounds(month)
    tenant_currencies = set(
        UsageRecord.objects.filter(invoice__isnull=True, created_at__lt=_midnight(period_end))
        .values_list("tenant_id", "currency").distinct().order_by()
    ) | set(
        Invoice.objects.filter(period_start=period_start, status=Invoice.Status.DRAFT)
        .values_list("tenant_id", "currency").distinct().order_by()
    )
    built = []
    for tenant_id, currency in sorted(tenant_currencies):
        invoice = invoice_draft_build(tenant=tenant_id, month=period_start, currency=currency)
        if finalize:
            try:
                invoice = invoice_finalize(invoice=invoice)
            except BillingError:
                logger.exception("invoice left as draft", extra={"tenant_id": tenant_id, "invoice_id": invoice.pk})
        built.append(invoice.pk)
    return built


def _want_stripe_push(action: str, invoice_id: int) -> None:
    """Announce it; billing.tasks (connected in BillingConfig.ready) enqueues the push."""
    signals.stripe_push_wanted.send(sender=Invoice, invoice_id=invoice_id, action=action)
