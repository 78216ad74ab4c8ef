"""Reads: price lookups for the gateway, spend for budgets, exact money sums for invoices and checks."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from django.db.models import BooleanField, Case, F, Q, QuerySet, Sum, Value, When

from billing.models import Invoice, InvoiceLine, Price, UsageRecord
from billing.money import METER_CACHED_INPUT, METER_INPUT, METER_OUTPUT, ZERO, exact_sum, token_cost


def price_lookup(*, model: str, adapter: str | None, tier: str | None, at: datetime) -> Price | None:
    """The price in force at `at`: most specific first (the model by name over the any-model `*` entry,
    then adapter match, then tier), then the latest start."""
    candidates = (
        Price.objects.filter(model__in={model, Price.ANY_MODEL}, effective_from__lte=at)
        .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=at))
        .filter(adapter__in={adapter or "", ""}, tier__in={tier or "", ""})
    )
    best = max(candidates, key=lambda p: (p.model == model, p.specificity, p.effective_from, p.id), default=None)
    return best


def price_estimate(
    *, model: str, adapter: str | None, tier: str | None, prompt_tokens: int, completion_tokens: int, at: datetime,
    batch: bool = False, embeddings: bool = False,
) -> Decimal:
    """Upper bound of what a request will cost, for the gateway to reserve against a spend budget.

    Every prompt token is charged at the dearer of the input and cached-input rates (the cache hit
    is unknown beforehand). Unpriced models estimate to zero, like their usage records. A batch line
    (`batch`) is estimated at the price's batch share, as the ledger will price it.
    """
    price = price_lookup(model=model, adapter=adapter, tier=tier, at=at)
    if price is None:
        return ZERO
    prompt_rate = max(price.rate("input_per_mtok", batch=batch, embeddings=embeddings),
                      price.rate("cached_input_per_mtok", batch=batch, embeddings=embeddings))
    return token_cost(prompt_tokens, prompt_rate) + token_cost(completion_tokens, price.rate("output_per_mtok", batch=batch))


def usage_meter_totals_by_price(records: QuerySet[UsageRecord], *extra_keys: str) -> list[dict]:
    """Token sums per meter grouped by price (and `extra_keys`): integer sums, exact on every database."""
    return list(
        records.order_by()
        # Batch lines are priced at the price's batch share: their own group (and invoice line).
        # Embeddings requests likewise (the price's embeddings input rate).
        .values("price_id", "embeddings", *extra_keys, batch=Case(When(batch_id="", then=Value(False)), default=Value(True),
                                                    output_field=BooleanField()))
        .annotate(
            **{
                METER_INPUT: Sum(F("prompt_tokens") - F("cached_tokens")),
                METER_CACHED_INPUT: Sum("cached_tokens"),
                METER_OUTPUT: Sum("completion_tokens"),
            }
        )
    )


def exact_amount(groups: Iterable[dict], prices: dict[int, Price]) -> Decimal:
    """Exact money for grouped token sums: Σ tokens × rate, which equals Σ of the records' stored amounts."""
    parts = []
    for group in groups:
        price = prices.get(group["price_id"])
        if price is None:
            continue
        parts += [
            token_cost(group[METER_INPUT] or 0, price.rate("input_per_mtok", batch=group.get("batch", False),
                                                           embeddings=group.get("embeddings", False))),
            token_cost(group[METER_CACHED_INPUT] or 0, price.rate("cached_input_per_mtok", batch=group.get("batch", False),
                                                                  embeddings=group.get("embeddings", False))),
            token_cost(group[METER_OUTPUT] or 0, price.rate("output_per_mtok", batch=group.get("batch", False))),
        ]
    return exact_sum(parts)


def usage_exact_amount(records: QuerySet[UsageRecord]) -> Decimal:
    groups = usage_meter_totals_by_price(records)
    prices = Price.objects.in_bulk([g["price_id"] for g in groups if g["price_id"] is not None])
    return exact_amount(groups, prices)


def tenant_spend(*, tenant, start: datetime, end: datetime) -> Decimal:
    """Exact spend of `tenant` on requests that started in [start, end) (unrounded, 16 places).

    Computed from integer token sums per price over the (tenant, created_at) index, so it is exact
    on SQLite too and never waits for a roll-up.
    """
    tenant_id = getattr(tenant, "pk", tenant)
    records = UsageRecord.objects.filter(tenant_id=tenant_id, created_at__gte=start, created_at__lt=end)
    return usage_exact_amount(records)


def tenant_tokens(*, tenant, start: datetime, end: datetime) -> int:
    """Prompt + completion tokens of `tenant`'s requests that started in [start, end) (the token budget's measure)."""
    tenant_id = getattr(tenant, "pk", tenant)
    totals = UsageRecord.objects.filter(tenant_id=tenant_id, created_at__gte=start, created_at__lt=end).aggregate(
        prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    return int(totals["prompt"] or 0) + int(totals["completion"] or 0)


def tenant_invoices(*, tenant) -> QuerySet[Invoice]:
    return Invoice.objects.filter(tenant_id=getattr(tenant, "pk", tenant)).prefetch_related("lines")


def invoice_lines_total(*, invoice: Invoice) -> Decimal:
    return exact_sum(InvoiceLine.objects.filter(invoice=invoice).values_list("amount", flat=True))


def usage_unpriced_count(*, records: QuerySet[UsageRecord]) -> int:
    return records.filter(price__isnull=True).count()
