"""Batch API usage on its own price line: the price's batch share (default 50 %, set per price),
exact amounts, a separate invoice line, spend that budgets see, and the batch id in the export."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from decimal import Decimal

import pytest

pytestmark = pytest.mark.django_db


def test_batch_usage_is_priced_at_half_by_default_and_exactly(price, make_event, ingest):
    online = ingest(make_event())
    batch = ingest(make_event(batch_id="batch_abc"))
    assert price.batch_percent == Decimal("50")
    assert batch.batch_id == "batch_abc" and online.batch_id == ""
    assert batch.amount * 2 == online.amount and batch.amount > 0
    assert batch.output_amount == Decimal(300) * Decimal("0.30") / 1_000_000  # 0.60 / 2 per 1M


def test_batch_share_is_set_per_price_and_rounded_to_the_price_books_places(make_price, make_event, ingest):
    from billing.errors import BillingError

    make_price(out="0.0000000003", batch_percent=Decimal("33.33"))
    record = ingest(make_event(batch_id="batch_x", prompt_tokens=0, cached_tokens=0, completion_tokens=10**6))
    assert record.output_amount == Decimal("0.0000000001")  # 0.0000000003 x 33.33 % at 10 places
    with pytest.raises(BillingError):
        make_price(model="other", batch_percent=Decimal("101"))


def test_invoice_has_its_own_batch_line_and_spend_counts_the_discount(price, make_event, ingest, tenant):
    from billing import services
    from billing.selectors import tenant_spend

    ingest(make_event())
    ingest(make_event(batch_id="batch_1"))
    ingest(make_event(batch_id="batch_2"))
    invoice = services.invoice_draft_build(tenant=tenant, month=datetime(2026, 11, 1).date())
    lines = list(invoice.lines.filter(kind="usage"))
    batch_lines = [line for line in lines if line.description.endswith("(batch)")]
    assert len(lines) == 6 and len(batch_lines) == 3  # three meters, online and batch
    output = next(line for line in batch_lines if line.meter == "output")
    assert output.quantity == 600 and output.unit_price == Decimal("0.30")
    spend = tenant_spend(tenant=tenant, start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 12, 1, tzinfo=UTC))
    from billing.models import UsageRecord

    assert spend == sum(r.amount for r in UsageRecord.objects.filter(tenant=tenant))  # exact, discount included


def test_the_gateways_spend_estimate_for_a_batch_line_is_at_the_batch_share(price):
    """A spend budget reserves and settles a batch line at what the ledger will charge for it, not at
    the online price (which would stop a batch-heavy tenant at half its budget)."""
    from billing.selectors import price_estimate

    kwargs = dict(model="llama-8b", adapter=None, tier=None, prompt_tokens=1000, completion_tokens=500,
                  at=datetime(2026, 11, 15, tzinfo=UTC))
    online, batch = price_estimate(**kwargs), price_estimate(**kwargs, batch=True)
    assert online == Decimal(1000) * Decimal("0.15") / 10**6 + Decimal(500) * Decimal("0.60") / 10**6
    assert batch * 2 == online


def test_finance_export_names_the_batch(price, make_event, ingest):
    from billing import exports

    ingest(make_event(batch_id="batch_exported"))
    ingest(make_event())
    rows = exports.usage_rows(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 12, 1, tzinfo=UTC))
    table = list(csv.DictReader(io.StringIO("".join(exports.csv_stream(exports.USAGE_COLUMNS, rows)))))
    assert sorted(row["batch_id"] for row in table) == ["", "batch_exported"]


def test_operators_set_the_batch_share_in_the_admin(admin_client, settings):
    from billing.models import Price

    settings.ROOT_URLCONF = "tests.billing.urls"
    form = {"model": "m", "adapter": "", "tier": "", "currency": "usd", "input_per_mtok": "0.2",
            "cached_input_per_mtok": "0.1", "output_per_mtok": "0.8", "effective_from_0": "2026-11-20",
            "effective_from_1": "00:00:00", "note": ""}
    assert b"batch_percent" in admin_client.get("/admin/billing/price/add/").content
    assert admin_client.post("/admin/billing/price/add/", {**form, "batch_percent": "40"}).status_code == 302
    assert admin_client.post("/admin/billing/price/add/", {**form, "model": "n"}).status_code == 302
    assert admin_client.post("/admin/billing/price/add/", {**form, "model": "o", "batch_percent": "120"}).status_code == 200
    assert {p.model: p.batch_percent for p in Price.objects.all()} == {"m": Decimal("40"), "n": Decimal("50")}


def test_batch_lines_are_left_out_of_the_online_slis():
    """A batch line waits behind the online tiers on purpose: its latency is not a missed target."""
    import uuid

    from django.utils import timezone

    from billing.events import UsageEvent
    from billing.services import usage_record_ingest
    from controlplane.slo import selectors
    from tenants import services

    tier = services.tier_create(name=f"t-{uuid.uuid4().hex[:6]}", priority=5, slo_ttft_p95_ms=500,
                                slo_itl_p95_ms=50, slo_availability_pct="99.000")
    tenant = services.tenant_create(name=f"Acme {uuid.uuid4().hex[:6]}", tier=tier)
    now = timezone.now()
    for batch_id, ttft in (("", 100.0), ("batch_slow", 9000.0), ("batch_slow", 9000.0)):
        usage_record_ingest(event=UsageEvent(
            request_id=f"r-{uuid.uuid4().hex}", tenant_id=tenant.pk, api_key_id=None, model="m1", adapter=None,
            tier=tier.name, prompt_tokens=10, cached_tokens=0, completion_tokens=5, ttft_ms=ttft,
            latency_ms=ttft + 100, status="ok", created_at=now - dt_seconds(60), http_status=200, itl_ms=20.0,
            batch_id=batch_id or None))
    [row] = [r for r in selectors.slo_status(now=now) if r.tenant == tenant.slug]
    assert row.windows["1h"]["ttft"]["total"] == 1 and row.windows["1h"]["ttft"]["bad"] == 0


def dt_seconds(n: int):
    import datetime

    return datetime.timedelta(seconds=n)
