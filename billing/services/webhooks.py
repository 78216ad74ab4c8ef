from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db import IntegrityError, transaction

from billing.errors import InvoiceStateError
from billing.models import Invoice, StripeEvent

from .invoices import invoice_mark_paid, invoice_void

logger = logging.getLogger("tessera.billing")
PAID_EVENTS = {"invoice.paid", "invoice.payment_succeeded"}
VOID_EVENTS = {"invoice.voided"}
STATUS_EVENTS = {"invoice.finalized", "invoice.payment_failed", "invoice.marked_uncollectible", "invoice.sent",
                 "invoice.updated", "invoice.overdue"}


def _find_invoice(stripe_invoice: dict) -> Invoice | None:
    local_id = (stripe_invoice.get("metadata") or {}).get("tessera_invoice_id")
    stripe_id = stripe_invoice.get("id") or ""
    if local_id and str(local_id).isdigit():
        invoice = Invoice.objects.filter(pk=int(local_id)).first()
        if invoice is not None and invoice.stripe_invoice_id in ("", stripe_id):
            return invoice
    return Invoice.objects.filter(stripe_invoice_id=stripe_id).first() if stripe_id else None


def _paid_at(stripe_invoice: dict) -> datetime | None:
    stamp = (stripe_invoice.get("status_transitions") or {}).get("paid_at")
    return datetime.fromtimestamp(int(stamp), tz=UTC) if stamp else None


def _apply(event_type: str, stripe_invoice: dict) -> tuple[Invoice | None, str]:
    invoice = _find_invoice(stripe_invoice)
    if invoice is None:
        return None, "ignored: no matching invoice"
    try:
        if event_type in PAID_EVENTS:
            invoice = invoice_mark_paid(invoice=invoice, paid_at=_paid_at(stripe_invoice))
        elif event_type in VOID_EVENTS:
            invoice = invoice_void(invoice=invoice, reason="voided in Stripe", from_stripe=True)
    except InvoiceStateError as exc:
        logger.warning("stripe event does not apply to invoice state", extra={"invoice_id": invoice.pk})
        return invoice, f"ignored: {exc}"[:200]
    status = stripe_invoice.get("status")
    if status and (event_type in PAID_EVENTS | VOID_EVENTS or invoice.status == Invoice.Status.FINALIZED):
        Invoice.objects.filter(pk=invoice.pk).update(stripe_status=status)
    return invoice, "applied"


def stripe_event_process(*, event: dict) -> tuple[StripeEvent, bool]:
    """Apply one verified Stripe event exactly once. Returns (event row, applied now?).

    The event id is stored in the same transaction as its effect, so a replayed or concurrently
    re-delivered event finds the row and does nothing.
    """
    with transaction.atomic():
        try:
            with transaction.atomic():
                row = StripeEvent.objects.create(
                    event_id=event["id"], type=event.get("type", ""), livemode=bool(event.get("livemode"))
                )
        except IntegrityError:
            return StripeEvent.objects.get(event_id=event["id"]), False
        event_type = row.type
        obj = (event.get("data") or {}).get("object") or {}
        if event_type.startswith("invoice.") and (event_type in PAID_EVENTS | VOID_EVENTS | STATUS_EVENTS):
            row.invoice, row.outcome = _apply(event_type, obj)
        else:
            row.outcome = "ignored: event type not handled"
        row.save(update_fields=["invoice", "outcome"])
    return row, True
