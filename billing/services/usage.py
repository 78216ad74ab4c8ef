from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, transaction

from billing.errors import BillingError
from billing.events import UsageEvent
from billing.models import Invoice, Price, UsageRecord
from billing.money import ZERO, exact_sum, token_cost
from billing.selectors import price_lookup
from tenants.models import APIKey

logger = logging.getLogger("tessera.billing")
STATUSES = {choice.value for choice in UsageRecord.Status}


def _validate(event: UsageEvent) -> None:
    if not event.request_id or len(event.request_id) > 128:
        raise BillingError("usage event needs a request_id of 1 to 128 characters")
    if event.created_at.tzinfo is None:
        raise BillingError(f"usage event {event.request_id}: created_at must be timezone-aware")
    if min(event.prompt_tokens, event.cached_tokens, event.completion_tokens) < 0:
        raise BillingError(f"usage event {event.request_id}: token counts must be >= 0")
    if event.cached_tokens > event.prompt_tokens:
        raise BillingError(f"usage event {event.request_id}: cached_tokens exceeds prompt_tokens")
    if event.status not in STATUSES:
        raise BillingError(f"usage event {event.request_id}: unknown status {event.status!r}")
    if event.batch_line and (len(event.batch_line) > 80 or not event.batch_id):
        raise BillingError(f"usage event {event.request_id}: a batch_line needs a batch_id and at most 80 characters")


def _priced_fields(*, prompt: int, cached: int, completion: int, price: Price | None, batch: bool = False,
                   embeddings: bool = False) -> dict:
    if price is None:
        return {
            "price": None, "currency": getattr(settings, "BILLING_DEFAULT_CURRENCY", "usd"),
            "input_amount": ZERO, "cached_input_amount": ZERO, "output_amount": ZERO, "amount": ZERO,
        }
    parts = {
        "input_amount": token_cost(prompt - cached, price.rate("input_per_mtok", batch=batch, embeddings=embeddings)),
        "cached_input_amount": token_cost(cached, price.rate("cached_input_per_mtok", batch=batch,
                                                             embeddings=embeddings)),
        "output_amount": token_cost(completion, price.rate("output_per_mtok", batch=batch)),
    }
    return {"price": price, "currency": price.currency, **parts, "amount": exact_sum(parts.values())}


def _api_key(api_key_id: int | None) -> tuple[int | None, str]:
    """The key's id and a snapshot of its visible prefix, so exports still name the key after it is
    deleted. A key deleted before its request's usage arrived is billed to the tenant without a key
    (as the foreign key's SET_NULL would have left it), never refused."""
    if api_key_id is None:
        return None, ""
    prefix = APIKey.objects.filter(pk=api_key_id).values_list("prefix", flat=True).first()
    return (api_key_id, prefix) if prefix is not None else (None, "")


def _same_usage(record: UsageRecord, event: UsageEvent) -> bool:
    return (record.tenant_id, record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (
        event.tenant_id, event.prompt_tokens, event.cached_tokens, event.completion_tokens,
    )


def _existing(event: UsageEvent) -> UsageRecord | None:
    record = UsageRecord.objects.filter(request_id=event.request_id).first()
    if record is None and event.batch_line:
        record = UsageRecord.objects.filter(batch_line=event.batch_line).first()
        if record is not None:
            # Another attempt of the same batch line (a retry, or a re-send after its runner died) was
            # billed already: the line is billed once, whatever this attempt served.
            logger.warning(
                "batch line already billed under another request; this attempt is not billed",
                extra={"request_id": event.request_id, "billed_request_id": record.request_id,
                       "batch_id": event.batch_id},
            )
            return record
    if record is not None and not _same_usage(record, event):
        # First write wins: the ledger never changes a billed request. Loud, because the producer is wrong.
        logger.warning(
            "usage event replay differs from the recorded request; keeping the first",
            extra={"request_id": event.request_id, "tenant_id": event.tenant_id},
        )
    return record


def usage_record_ingest(*, event: UsageEvent) -> UsageRecord | None:
    """Write the ledger row for one served request, exactly once.

    Idempotent on `event.request_id`: a duplicate delivery, a retry after a crash, or the same event
    ingested concurrently by several processes all return the one row (the unique index decides;
    the loser of the race reads the winner's row). Priced at write time with the price in force at
    `event.created_at`; the price id is kept. Safe inside a caller's transaction (uses a savepoint).

    A batch line's attempts (`event.batch_line` set) are also unique on the line: the first attempt
    that served tokens is the line's one row, and any other attempt of it returns that row, billed
    nothing more. An attempt that served nothing writes no row (None back), so that it cannot take
    the line's place before the attempt that is served: a line has at most one ledger row, the one
    that bills it.
    """
    _validate(event)
    if event.batch_line and event.prompt_tokens == 0 and event.completion_tokens == 0:
        return None
    # No "does it exist?" read first: duplicates are rare, so the unique index answers them and the
    # common path is three statements (price, key prefix, insert).
    price = price_lookup(model=event.model, adapter=event.adapter, tier=event.tier, at=event.created_at)
    api_key_id, api_key_prefix = _api_key(event.api_key_id)
    fields = dict(
        request_id=event.request_id,
        tenant_id=event.tenant_id,
        api_key_id=api_key_id,
        api_key_prefix=api_key_prefix,
        model=event.model,
        adapter=event.adapter or "",
        tier=event.tier or "",
        status=event.status,
        prompt_tokens=event.prompt_tokens,
        cached_tokens=event.cached_tokens,
        completion_tokens=event.completion_tokens,
        ttft_ms=event.ttft_ms,
        latency_ms=event.latency_ms,
        http_status=event.http_status,
        itl_ms=event.itl_ms,
        created_at=event.created_at,
        batch_id=event.batch_id or "",
        batch_line=event.batch_line or "",
        embeddings=event.embeddings,
        worker_url=event.worker_url or "",
        **_priced_fields(
            prompt=event.prompt_tokens, cached=event.cached_tokens, completion=event.completion_tokens, price=price,
            batch=bool(event.batch_id), embeddings=event.embeddings,
        ),
    )
    try:
        with transaction.atomic():
            record = UsageRecord.objects.create(**fields)
    except IntegrityError:
        record = _existing(event)  # a duplicate, or lost the race to a concurrent writer: its row is the answer
        if record is None:
            raise  # some other constraint (unknown tenant...): a real error
        return record
    if price is None:
        logger.error(
            "no price in force for served request; recorded unpriced",
            extra={"request_id": event.request_id, "model": event.model, "adapter": event.adapter, "tier": event.tier},
        )
    return record


def usage_records_reprice(*, start: datetime, end: datetime, tenant=None) -> int:
    """Price the unpriced records of [start, end) that are not on a finalized invoice. Returns how many."""
    records = UsageRecord.objects.filter(price__isnull=True, created_at__gte=start, created_at__lt=end)
    if tenant is not None:
        records = records.filter(tenant_id=getattr(tenant, "pk", tenant))
    records = records.exclude(invoice__status__in=[Invoice.Status.FINALIZED, Invoice.Status.PAID])
    repriced = 0
    with transaction.atomic():
        for record in records.select_for_update(of=("self",)):
            price = price_lookup(model=record.model, adapter=record.adapter, tier=record.tier, at=record.created_at)
            if price is None:
                continue
            fields = _priced_fields(
                prompt=record.prompt_tokens, cached=record.cached_tokens, completion=record.completion_tokens, price=price,
                batch=bool(record.batch_id), embeddings=record.embeddings,
            )
            if record.invoice_id is not None and fields["currency"] != record.currency:
                fields["invoice"] = None  # its draft is in another currency; the right one will pick it up
            for name, value in fields.items():
                setattr(record, name, value)
            record.save(update_fields=list(fields))
            repriced += 1
    return repriced
