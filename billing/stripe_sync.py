"""Stripe, through the official SDK: a customer per tenant, meter events per usage record, invoices.

Every POST carries a deterministic Idempotency-Key derived from our ids (the SDK would otherwise
invent a random one per call, which makes a Celery retry a duplicate), and every Stripe id is
saved as soon as it exists, so a crash between steps resumes where it stopped. Without
STRIPE_API_KEY all of this is off and invoicing works locally.

Meter events are informational (usage in Stripe's dashboard and portal): money is billed by the
invoice items pushed from our finalized invoices. Do not attach the meters to paid prices in
Stripe, or usage would be billed twice.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import stripe
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.models import Invoice, InvoiceLine, StripeCustomer, UsageRecord
from billing.money import to_minor_units
from controlplane import audit
from tenants.models import Tenant

logger = logging.getLogger("tessera.billing")
DEFAULT_METER_EVENT_NAMES = {
    "input": "tessera_input_tokens",
    "cached_input": "tessera_cached_input_tokens",
    "output": "tessera_output_tokens",
}
# Stripe accepts meter events up to 35 days old; older records are marked and left to the invoice.
METER_EVENT_MAX_AGE = timedelta(days=35)
# Errors worth retrying later (network, 5xx, 429, lock conflicts); anything else is our bug or bad data.
RETRYABLE_ERRORS = (stripe.APIConnectionError, stripe.APIError, stripe.RateLimitError)


def stripe_enabled() -> bool:
    return bool(getattr(settings, "STRIPE_API_KEY", ""))


def stripe_client() -> stripe.StripeClient:
    base = getattr(settings, "STRIPE_API_BASE", "")
    addresses = {"api": base, "meter_events": base} if base else None
    return stripe.StripeClient(
        settings.STRIPE_API_KEY,
        base_addresses=addresses,
        max_network_retries=getattr(settings, "STRIPE_MAX_NETWORK_RETRIES", 2),
    )


def _meter_event_names() -> dict[str, str]:
    return {**DEFAULT_METER_EVENT_NAMES, **getattr(settings, "STRIPE_METER_EVENT_NAMES", {})}


def customer_ensure(*, tenant, client: stripe.StripeClient | None = None) -> str:
    """The tenant's Stripe customer id, created once (idempotency key = tenant id)."""
    tenant_id = getattr(tenant, "pk", tenant)
    existing = StripeCustomer.objects.filter(tenant_id=tenant_id).values_list("stripe_customer_id", flat=True).first()
    if existing:
        return existing
    tenant_obj = Tenant.objects.get(pk=tenant_id)
    customer = (client or stripe_client()).v1.customers.create(
        params={"name": tenant_obj.name, "metadata": {"tessera_tenant_id": str(tenant_id), "tessera_slug": tenant_obj.slug}},
        options={"idempotency_key": f"tessera-customer-{tenant_id}"},
    )
    with transaction.atomic():
        row, created = StripeCustomer.objects.get_or_create(
            tenant_id=tenant_id, defaults={"stripe_customer_id": customer.id})
        if created:
            audit.record("stripe_customer.create", row)
    return row.stripe_customer_id


def meter_identifier(record_id: int, meter: str) -> str:
    """Stripe dedupes meter events on this; it is also the request's Idempotency-Key."""
    return f"tessera-usage-{record_id}-{meter}"


def usage_report(*, record_ids: list[int]) -> int:
    """Send the meter events of each unreported record, then mark it. Returns how many were reported.

    Re-sending after a crash is harmless: same identifiers, same idempotency keys. Network errors,
    5xx and 429 propagate (the task retries); a 4xx marks that record and moves on.
    """
    client = stripe_client()
    reported = 0
    records = UsageRecord.objects.filter(pk__in=record_ids, stripe_reported_at__isnull=True, stripe_report_error="")
    for record in records.order_by("id"):
        if timezone.now() - record.created_at > METER_EVENT_MAX_AGE:
            UsageRecord.objects.filter(pk=record.pk).update(stripe_report_error="too old for Stripe meter events")
            continue
        customer_id = customer_ensure(tenant=record.tenant_id, client=client)
        try:
            for meter, quantity in record.meter_quantities().items():
                if quantity:
                    _meter_event_send(client, record, meter, quantity, customer_id)
        except RETRYABLE_ERRORS:
            raise
        except stripe.StripeError as exc:  # retrying cannot help: keep it visible for an operator
            logger.error("stripe refused meter event", extra={"request_id": record.request_id, "error": str(exc)})
            UsageRecord.objects.filter(pk=record.pk).update(stripe_report_error=str(exc)[:500] or "error")
            continue
        UsageRecord.objects.filter(pk=record.pk, stripe_reported_at__isnull=True).update(stripe_reported_at=timezone.now())
        reported += 1
    return reported


def _meter_event_send(client: stripe.StripeClient, record: UsageRecord, meter: str, quantity: int, customer_id: str) -> None:
    identifier = meter_identifier(record.pk, meter)
    try:
        client.v1.billing.meter_events.create(
            params={
                "event_name": _meter_event_names()[meter],
                "identifier": identifier,
                "timestamp": int(record.created_at.timestamp()),
                "payload": {"stripe_customer_id": customer_id, "value": str(quantity)},
            },
            options={"idempotency_key": identifier},
        )
    except stripe.InvalidRequestError as exc:
        if not _already_recorded(exc):  # resent after Stripe forgot the idempotency key (24 h): done
            raise


def _already_recorded(exc: stripe.StripeError) -> bool:
    """Stripe refuses a meter event whose identifier it has seen: the usage is already there."""
    message = str(getattr(exc, "user_message", None) or exc).lower()
    return isinstance(exc, stripe.InvalidRequestError) and "identifier" in message and "already" in message


def usage_pending_ids(*, limit: int) -> list[int]:
    return list(
        UsageRecord.objects.filter(stripe_reported_at__isnull=True, stripe_report_error="")
        .order_by("id").values_list("id", flat=True)[:limit]
    )


def _save(invoice: Invoice, **fields) -> None:
    for name, value in fields.items():
        setattr(invoice, name, value)
    Invoice.objects.filter(pk=invoice.pk).update(**fields)


def invoice_push(*, invoice_id: int) -> Invoice:
    """Mirror a finalized invoice in Stripe: invoice, one item per line, finalize. Resumable and idempotent."""
    invoice = Invoice.objects.select_related("tenant").get(pk=invoice_id)
    if invoice.status not in (Invoice.Status.FINALIZED, Invoice.Status.PAID):
        return invoice
    if invoice.stripe_invoice_id and invoice.stripe_status not in ("", "draft"):
        return invoice  # already finalized in Stripe
    client = stripe_client()
    customer_id = customer_ensure(tenant=invoice.tenant_id, client=client)
    if not invoice.stripe_invoice_id:
        created = client.v1.invoices.create(
            params={
                "customer": customer_id,
                "currency": invoice.currency,
                "auto_advance": False,
                "collection_method": getattr(settings, "STRIPE_COLLECTION_METHOD", "send_invoice"),
                "days_until_due": getattr(settings, "STRIPE_DAYS_UNTIL_DUE", 30),
                "pending_invoice_items_behavior": "exclude",
                "description": f"Tessera usage {invoice.period_start:%Y-%m}",
                "metadata": {"tessera_invoice_id": str(invoice.pk), "tessera_invoice_number": invoice.number or ""},
            },
            options={"idempotency_key": f"tessera-invoice-{invoice.pk}"},
        )
        _save(invoice, stripe_invoice_id=created.id, stripe_status=getattr(created, "status", None) or "draft")
    for line in invoice.lines.filter(stripe_invoice_item_id="").order_by("id"):
        item = client.v1.invoice_items.create(
            params={
                "customer": customer_id,
                "invoice": invoice.stripe_invoice_id,
                "amount": to_minor_units(line.amount, invoice.currency),
                "currency": invoice.currency,
                "description": line.description,
                "metadata": {"tessera_invoice_line_id": str(line.pk), "tessera_invoice_id": str(invoice.pk)},
            },
            options={"idempotency_key": f"tessera-invoice-line-{line.pk}"},
        )
        InvoiceLine.objects.filter(pk=line.pk).update(stripe_invoice_item_id=item.id)
    finalized = client.v1.invoices.finalize_invoice(
        invoice.stripe_invoice_id,
        params={"auto_advance": True},
        options={"idempotency_key": f"tessera-invoice-finalize-{invoice.pk}"},
    )
    expected, remote_total = to_minor_units(invoice.total, invoice.currency), getattr(finalized, "total", None)
    if remote_total is not None and int(remote_total) != expected:
        logger.error(
            "stripe invoice total differs from ours",
            extra={"invoice_id": invoice.pk, "stripe_total": remote_total, "expected": expected},
        )
    with transaction.atomic():
        _save(invoice, stripe_status=getattr(finalized, "status", None) or "open", stripe_synced_at=timezone.now())
    return invoice


def invoice_void_push(*, invoice_id: int) -> Invoice:
    invoice = Invoice.objects.get(pk=invoice_id)
    if not invoice.stripe_invoice_id or invoice.stripe_status == "void":
        return invoice
    client = stripe_client()
    if invoice.stripe_status in ("", "draft"):
        client.v1.invoices.delete(invoice.stripe_invoice_id, options={})  # drafts are deleted, not voided
        _save(invoice, stripe_status="deleted", stripe_synced_at=timezone.now())
        return invoice
    voided = client.v1.invoices.void_invoice(
        invoice.stripe_invoice_id, options={"idempotency_key": f"tessera-invoice-void-{invoice.pk}"}
    )
    _save(invoice, stripe_status=getattr(voided, "status", None) or "void", stripe_synced_at=timezone.now())
    return invoice


def invoices_pending_ids(*, limit: int) -> list[int]:
    """Finalized invoices not yet finalized in Stripe (the sweeper's work list)."""
    return list(
        Invoice.objects.filter(status__in=[Invoice.Status.FINALIZED, Invoice.Status.PAID])
        .filter(stripe_status__in=["", "draft"]).order_by("id").values_list("id", flat=True)[:limit]
    )
