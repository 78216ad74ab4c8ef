"""Invoices: total = Σ lines = Σ usage × price (rounded once per line), lifecycle, credits, late usage."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import services
from billing.errors import BillingError, InvoiceStateError
from billing.models import Invoice, InvoiceLine, UsageRecord
from billing.money import exact_sum, round_money

pytestmark = pytest.mark.django_db
D = Decimal
NOV_1 = date(2026, 11, 1)


def at(day: int, hour: int = 12) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


def build(tenant, month=NOV_1):
    return services.invoice_draft_build(tenant=tenant, month=month)


def test_invoice_equals_lines_equals_usage_times_price(price, make_event, ingest, tenant):
    events = [make_event(prompt_tokens=1000 + i * 37, cached_tokens=i * 11, completion_tokens=500 + i * 13,
                         created_at=at(1 + i % 28)) for i in range(60)]
    for event in events:
        ingest(event)
    invoice = build(tenant)
    lines = list(invoice.lines.all())
    assert {line.meter for line in lines} == {"input", "cached_input", "output"}
    # each line: quantity = Σ tokens of that meter; amount = quantity × rate, rounded half-up once
    sums = {
        "input": sum(e.prompt_tokens - e.cached_tokens for e in events),
        "cached_input": sum(e.cached_tokens for e in events),
        "output": sum(e.completion_tokens for e in events),
    }
    rates = {"input": price.input_per_mtok, "cached_input": price.cached_input_per_mtok, "output": price.output_per_mtok}
    for line in lines:
        assert line.quantity == sums[line.meter]
        assert line.unit_price == rates[line.meter]
        assert line.exact_amount == D(line.quantity) * rates[line.meter] / 1_000_000
        assert line.amount == round_money(line.exact_amount, "ROUND_HALF_UP")
    assert invoice.total == exact_sum(line.amount for line in lines)
    # and the exact line amounts add up to the ledger's per-request amounts
    ledger = exact_sum(UsageRecord.objects.values_list("amount", flat=True))
    assert exact_sum(line.exact_amount for line in lines) == ledger
    assert invoice.rounding == "ROUND_HALF_UP" and invoice.status == Invoice.Status.DRAFT


def test_price_change_mid_month_gives_lines_per_price(make_price, make_event, ingest, tenant):
    change = at(15, 0)
    make_price(inp="1", cached="0.5", out="2")
    make_price(inp="3", cached="1.5", out="4", start=change)
    ingest(make_event(created_at=change - timedelta(seconds=1), prompt_tokens=1_000_000, cached_tokens=0,
                      completion_tokens=1_000_000))
    ingest(make_event(created_at=change, prompt_tokens=1_000_000, cached_tokens=0, completion_tokens=1_000_000))
    invoice = build(tenant)
    amounts = sorted((line.unit_price, line.amount) for line in invoice.lines.all())
    assert amounts == [(D("1"), D("1.00")), (D("2"), D("2.00")), (D("3"), D("3.00")), (D("4"), D("4.00"))]
    assert invoice.total == D("10.00")


@pytest.mark.parametrize(
    ("tokens", "rate", "half_up", "half_even"),
    [
        (50_000, "0.1", D("0.01"), D("0.00")),  # exactly half a cent
        (150_000, "0.1", D("0.02"), D("0.02")),  # 1.5 cents
        (250_000, "0.1", D("0.03"), D("0.02")),  # 2.5 cents
        (49_999, "0.1", D("0.00"), D("0.00")),  # just under half a cent
        (1, "0.0000000001", D("0.00"), D("0.00")),  # the smallest amount the ledger can hold
        (3, "3333.3333333333", D("0.01"), D("0.01")),  # 0.0099999999999999
    ],
)
def test_rounding_edge_cases_per_line(make_price, make_event, ingest, tenant, settings, tokens, rate, half_up, half_even):
    make_price(inp=rate, cached="0", out="0")
    ingest(make_event(prompt_tokens=tokens, cached_tokens=0, completion_tokens=0))
    assert build(tenant).total == half_up
    settings.BILLING_ROUNDING = "ROUND_HALF_EVEN"
    invoice = build(tenant)  # drafts pick up the configured rule when rebuilt
    assert (invoice.total, invoice.rounding) == (half_even, "ROUND_HALF_EVEN")


def test_many_half_cents_round_per_line_not_per_request(make_price, make_event, ingest, tenant):
    """200 requests of 0.5 cent each: per-request rounding would bill 2.00; per line it is exactly 1.00."""
    make_price(inp="0.1", cached="0", out="0")
    for _ in range(200):
        ingest(make_event(prompt_tokens=50_000, cached_tokens=0, completion_tokens=0))
    assert build(tenant).total == D("1.00")


def test_credits_and_adjustments_are_explicit_lines(price, make_event, ingest, tenant):
    ingest(make_event(prompt_tokens=10_000_000, cached_tokens=0, completion_tokens=0))  # 1.50
    invoice = build(tenant)
    services.invoice_line_add(invoice=invoice, kind="credit", description="SLO breach credit", amount=D("-0.40"))
    services.invoice_line_add(invoice=invoice, kind="adjustment", description="support hours", amount=D("2.00"))
    invoice.refresh_from_db()
    assert invoice.total == D("3.10")
    invoice = build(tenant)  # rebuilding recomputes usage lines and keeps manual ones
    assert invoice.total == D("3.10") and invoice.lines.count() == 3
    with pytest.raises(BillingError, match="negative"):
        services.invoice_line_add(invoice=invoice, kind="credit", description="x", amount=D("1"))
    with pytest.raises(BillingError, match="cents"):
        services.invoice_line_add(invoice=invoice, kind="adjustment", description="x", amount=D("0.001"))
    with pytest.raises(BillingError, match="by hand"):
        services.invoice_line_add(invoice=invoice, kind="usage", description="x", amount=D("1"))


def test_finalized_invoice_is_immutable(price, make_event, ingest, tenant):
    ingest(make_event())
    invoice = services.invoice_finalize(invoice=build(tenant))
    assert invoice.status == Invoice.Status.FINALIZED and invoice.number.startswith("TSR-202611-")
    total, lines = invoice.total, list(invoice.lines.values_list("id", "amount"))
    with pytest.raises(InvoiceStateError):
        build(tenant)
    with pytest.raises(InvoiceStateError):
        services.invoice_line_add(invoice=invoice, kind="credit", description="x", amount=D("-1"))
    with pytest.raises(InvoiceStateError):
        services.invoice_finalize(invoice=invoice)
    ingest(make_event(created_at=at(20)))  # usage that arrives after finalizing waits for the next invoice
    invoice.refresh_from_db()
    assert invoice.total == total and list(invoice.lines.values_list("id", "amount")) == lines


def test_late_usage_lands_on_the_next_invoice(price, make_event, ingest, tenant):
    ingest(make_event(created_at=at(5)))
    november = services.invoice_finalize(invoice=build(tenant))
    late = ingest(make_event(created_at=at(30, 23)))  # a November request whose event arrived late
    ingest(make_event(created_at=datetime(2026, 12, 3, tzinfo=UTC)))
    december = build(tenant, month=date(2026, 12, 1))
    late.refresh_from_db()
    assert late.invoice_id == december.pk
    assert december.usage_records.count() == 2 and november.usage_records.count() == 1
    # every record is on exactly one invoice
    assert UsageRecord.objects.filter(invoice__isnull=True).count() == 0


def test_finalize_refuses_unpriced_usage(make_event, ingest, tenant, make_price):
    ingest(make_event(model="mystery"))
    with pytest.raises(BillingError, match="no price"):
        services.invoice_finalize(invoice=build(tenant))
    assert Invoice.objects.get().status == Invoice.Status.DRAFT
    make_price(model="mystery")
    services.usage_records_reprice(start=at(1, 0), end=at(30, 23))
    assert services.invoice_finalize(invoice=Invoice.objects.get()).status == Invoice.Status.FINALIZED


def test_paid_and_void_transitions(price, make_event, ingest, tenant):
    ingest(make_event())
    draft = build(tenant)
    with pytest.raises(InvoiceStateError):
        services.invoice_mark_paid(invoice=draft)
    invoice = services.invoice_finalize(invoice=draft)
    paid = services.invoice_mark_paid(invoice=invoice)
    assert paid.status == Invoice.Status.PAID and paid.paid_at is not None
    assert services.invoice_mark_paid(invoice=invoice).paid_at == paid.paid_at  # idempotent
    with pytest.raises(InvoiceStateError, match="refund"):
        services.invoice_void(invoice=invoice)


def test_void_releases_usage_for_a_corrected_invoice(price, make_event, ingest, tenant):
    ingest(make_event())
    first = services.invoice_finalize(invoice=build(tenant))
    voided = services.invoice_void(invoice=first, reason="wrong address")
    assert voided.status == Invoice.Status.VOID and voided.usage_records.count() == 0
    second = build(tenant)
    assert second.pk != first.pk and second.total == first.total and second.usage_records.count() == 1


def test_build_month_for_every_tenant(price, make_event, ingest, make_tenant, tenant):
    other = make_tenant()
    ingest(make_event())
    ingest(make_event(tenant_id=other.pk, api_key_id=None))
    ids = services.invoices_build_month(month=NOV_1, finalize=True)
    assert len(ids) == 2
    assert set(Invoice.objects.values_list("status", flat=True)) == {"finalized"}
    assert services.invoices_build_month(month=NOV_1, finalize=True) == []  # nothing left to bill


def test_one_live_invoice_per_tenant_month(price, make_event, ingest, tenant):
    ingest(make_event())
    assert build(tenant).pk == build(tenant).pk
    assert Invoice.objects.count() == 1
    assert InvoiceLine.objects.filter(kind="usage").count() == 3
