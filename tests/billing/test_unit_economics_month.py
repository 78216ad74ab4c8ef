"""A month of mixed traffic reconciles: revenue equals the invoices, cost + idle equals rates x hours.

Chat, Batch API lines (at the batch share), embeddings and a LoRA adapter, for two tenants, on two
worker classes, one of whose rates changes mid-month, with replicas that start and stop off the
hour. The expected cost is computed here from the spans and rates alone, hour by hour, and compared
to the cent with what `cost_hours_rebuild` stored and what the report says.
"""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest

from tests.billing.cost_fixtures import rate, span

pytestmark = pytest.mark.django_db
NOV, DEC = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
RATE_CHANGE = datetime(2026, 11, 16, 0, tzinfo=UTC)
D = Decimal


def _expected_cost(spans: list, rates: dict) -> Decimal:
    """Sum over spans and hours of round(up seconds x rate / 3600, cent), by this test's own arithmetic."""
    total = D(0)
    hour = NOV
    while hour < DEC:
        for s in spans:
            start, end = max(s.started_at, hour), min(s.last_seen_at, hour + timedelta(hours=1))
            if end <= start:
                continue
            seconds = D((end - start).total_seconds()).quantize(D("0.000001"))
            hourly = rates[s.worker_class](hour)
            total += (seconds * hourly / 3600).quantize(D("0.01"), rounding=ROUND_HALF_UP)
        hour += timedelta(hours=1)
    return total


@pytest.fixture
def month(make_tenant, make_price, make_event, ingest):
    rng = random.Random(2911)
    make_price(embedding_input_per_mtok=D("0.02"))  # llama-8b: 0.15 / 0.075 / 0.60, batch at 50 %
    make_price(adapter="acme:support", inp="0.25", cached="0.10", out="0.90", batch_percent=D("40"))
    rate(worker_class="H100", hourly="3.60", prefill="8000", decode="400", start=NOV - timedelta(days=1))
    rate(worker_class="H100", hourly="4.10", prefill="8000", decode="400", start=RATE_CHANGE)
    rate(worker_class="L40S", hourly="1.234567", prefill="3000", decode="120", start=NOV - timedelta(days=1))
    spans = [
        span(started_at=NOV - timedelta(hours=5), last_seen_at=DEC + timedelta(hours=3), worker_url="http://h100:1",
             worker_class="H100", deployment="llama-h100"),
        span(started_at=datetime(2026, 11, 5, 8, 17, 23, 500_000, tzinfo=UTC),
             last_seen_at=datetime(2026, 11, 20, 14, 41, 7, 250_000, tzinfo=UTC), worker_url="http://l40s:1",
             worker_class="L40S", deployment="llama-l40s"),
        # The same worker serves again later, another replica: requests go to the span running then.
        span(started_at=datetime(2026, 11, 25, 0, 0, 1, tzinfo=UTC), last_seen_at=datetime(2026, 11, 27, tzinfo=UTC),
             worker_url="http://l40s:1", worker_class="L40S", deployment="llama-l40s-2"),
    ]
    tenants = [make_tenant(), make_tenant()]
    kinds = ["chat", "batch", "embeddings", "lora", "lora-batch"]
    for i in range(600):
        kind = kinds[i % len(kinds)]
        s = rng.choice(spans)
        at = s.started_at + (min(s.last_seen_at, DEC) - max(s.started_at, NOV)) * rng.random()
        at = max(at, NOV)
        prompt = rng.randint(1, 30_000)
        fields = dict(
            tenant_id=rng.choice(tenants).pk, api_key_id=None, created_at=at, worker_url=s.worker_url,
            prompt_tokens=prompt, cached_tokens=rng.randint(0, prompt // 2),
            completion_tokens=0 if kind == "embeddings" else rng.randint(0, 2_000),
            adapter="acme:support" if kind.startswith("lora") else None,
            embeddings=kind == "embeddings",
        )
        if "batch" in kind:
            fields.update(batch_id=f"batch_{i % 7}", batch_line=f"batch_{i % 7}:line-{i}")
        ingest(make_event(**fields))
    rates = {"H100": lambda h: D("3.60") if h < RATE_CHANGE else D("4.10"), "L40S": lambda h: D("1.234567")}
    return spans, rates, tenants


def test_a_month_of_mixed_traffic_reconciles(month):
    from billing.costs.report import unit_economics
    from billing.models import InvoiceLine, ReplicaHourCost, RequestCost, UsageRecord
    from billing.services import cost_hours_rebuild, invoices_build_month

    spans, rates, tenants = month
    rebuilt = cost_hours_rebuild(start=NOV, end=DEC)
    assert len(rebuilt) == 720 and sum(h.unattributed for h in rebuilt) == 0
    invoices_build_month(month=date(2026, 11, 1))
    report = unit_economics(start=NOV, end=DEC)

    # Every request is costed exactly once, every replica-hour adds up to the cent.
    assert RequestCost.objects.count() == UsageRecord.objects.count() == 600
    for hour in ReplicaHourCost.objects.all():
        assert hour.attributed_cost + hour.idle_cost == hour.total_cost
        assert hour.attributed_cost == sum(c.cost for c in hour.request_costs.all())

    # Cost + idle = rates x hours.
    expected = _expected_cost(spans, rates)
    (usd,) = report.summary
    assert usd.total_cost == usd.attributed_cost + usd.idle_cost == expected
    assert sum(d.total_cost for d in report.deployments) == expected
    assert usd.attributed_cost == sum(t.cost for t in report.tenants)

    # Revenue = the invoices: exactly per tenant against the lines' exact amounts, and each line rounded
    # once adds up to the invoice total.
    for tenant in tenants:
        lines = InvoiceLine.objects.filter(invoice__tenant=tenant, invoice__period_start=date(2026, 11, 1))
        revenue = sum(t.revenue for t in report.tenants if t.tenant_id == tenant.pk)
        assert revenue == sum(line.exact_amount for line in lines) > 0
        assert sum(line.amount for line in lines) == lines.first().invoice.total
    assert usd.revenue == sum(line.exact_amount for line in InvoiceLine.objects.all())
    assert usd.margin == usd.revenue - usd.total_cost

    # Every line is costed alike: chat, batch, embeddings and the adapter's, batch and not.
    costed = {(t.kind, bool(t.adapter)) for t in report.tenants if t.cost > 0}
    assert costed == {("online", False), ("batch", False), ("embeddings", False), ("online", True),
                      ("batch", True)}
    assert {d.deployment for d in report.deployments} == {"llama-h100", "llama-l40s", "llama-l40s-2"}
