"""Embeddings usage on its own price line: the price's embeddings input rate (the input rate when
blank) for every input token, cached or not; exact amounts, its own invoice line, the same money in
roll-ups, and the gateway's spend estimate at that rate."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db


def test_embeddings_input_is_priced_at_the_embeddings_rate_exactly(make_price, make_event, ingest):
    make_price(embedding_input_per_mtok=Decimal("0.02"))
    record = ingest(make_event(embeddings=True, prompt_tokens=1234, cached_tokens=34, completion_tokens=0))
    assert record.embeddings
    assert record.input_amount == Decimal(1200) * Decimal("0.02") / 10**6
    assert record.cached_input_amount == Decimal(34) * Decimal("0.02") / 10**6
    assert record.amount == Decimal(1234) * Decimal("0.02") / 10**6 and record.output_amount == 0
    online = ingest(make_event(prompt_tokens=1234, cached_tokens=34, completion_tokens=0))
    assert online.amount == (Decimal(1200) * Decimal("0.15") + Decimal(34) * Decimal("0.075")) / 10**6


def test_a_price_without_an_embeddings_rate_bills_embeddings_at_the_input_rate(price, make_event, ingest):
    record = ingest(make_event(embeddings=True, prompt_tokens=1000, cached_tokens=200, completion_tokens=0))
    assert record.amount == Decimal(1000) * Decimal("0.15") / 10**6


def test_invoice_line_roll_up_and_spend_estimate(make_price, make_event, ingest, tenant):
    from billing import services
    from billing.models import UsageDaily, UsageRecord
    from billing.selectors import price_estimate

    make_price(embedding_input_per_mtok=Decimal("0.01"))
    ingest(make_event())
    ingest(make_event(embeddings=True, prompt_tokens=5000, cached_tokens=0, completion_tokens=0))
    invoice = services.invoice_draft_build(tenant=tenant, month=date(2026, 11, 1))
    lines = list(invoice.lines.filter(kind="usage"))
    embedding_lines = [line for line in lines if line.description.endswith("(embeddings)")]
    assert len(embedding_lines) == 1 and len(lines) == 4  # three meters online, one input line for embeddings
    assert embedding_lines[0].quantity == 5000 and embedding_lines[0].unit_price == Decimal("0.01")
    ledger = sum(r.amount for r in UsageRecord.objects.filter(tenant=tenant))
    assert sum(line.exact_amount for line in lines) == ledger
    services.usage_daily_rebuild(day=date(2026, 11, 10))
    assert UsageDaily.objects.get(tenant=tenant).amount == ledger
    kwargs = dict(model="llama-8b", adapter=None, tier=None, prompt_tokens=10**6, completion_tokens=0,
                  at=datetime(2026, 11, 15, tzinfo=UTC))
    assert price_estimate(**kwargs, embeddings=True) == Decimal("0.01")
    assert price_estimate(**kwargs) == Decimal("0.15")


def test_an_embeddings_batch_line_is_priced_at_the_embeddings_rate_times_the_batch_share(make_price, make_event,
                                                                                        ingest, tenant):
    from billing import services
    from billing.selectors import price_estimate

    make_price(embedding_input_per_mtok=Decimal("0.02"), batch_percent=40)
    record = ingest(make_event(embeddings=True, batch_id="batch_e", prompt_tokens=5000, cached_tokens=100,
                               completion_tokens=0))
    assert record.amount == Decimal(5000) * Decimal("0.008") / 10**6  # 0.02 x 40%, cached tokens too
    invoice = services.invoice_draft_build(tenant=tenant, month=date(2026, 11, 1))
    lines = [x for x in invoice.lines.filter(kind="usage") if x.description.endswith("(batch) (embeddings)")]
    assert sorted((x.meter, x.quantity) for x in lines) == [("cached_input", 100), ("input", 4900)]
    assert {x.unit_price for x in lines} == {Decimal("0.008")}  # cached or not: one rate
    assert sum(x.exact_amount for x in lines) == record.amount
    kwargs = dict(model="llama-8b", adapter=None, tier=None, prompt_tokens=10**6, completion_tokens=0,
                  at=datetime(2026, 11, 15, tzinfo=UTC))
    assert price_estimate(**kwargs, embeddings=True, batch=True) == Decimal("0.008")


def test_a_negative_embeddings_rate_is_refused(make_price):
    from billing.errors import BillingError

    with pytest.raises(BillingError, match="embedding_input_per_mtok"):
        make_price(embedding_input_per_mtok=Decimal("-1"))
