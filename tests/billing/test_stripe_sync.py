"""Stripe sync through the official SDK against a local recording server (Stripe cannot be reached
from tests): deterministic Idempotency-Keys, meter events once, invoices mirrored, retries that
never duplicate."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import stripe
from django.utils import timezone

from billing import services, stripe_sync, tasks
from billing.models import Invoice, InvoiceLine, StripeCustomer, UsageRecord

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_retry_sleep")]


@pytest.fixture
def recent_event(make_event, make_price):
    """Meter events must be at most 35 days old, so these requests happen now."""
    make_price(start=timezone.now() - timedelta(days=60), model="llama-now")
    return lambda **f: make_event(model="llama-now", created_at=timezone.now() - timedelta(minutes=5), **f)


def keys(fake, path):
    return [r.headers.get("idempotency-key") for r in fake.posts(path)]


def test_everything_is_off_without_an_api_key(settings, recent_event, ingest, tenant):
    settings.STRIPE_API_KEY = ""
    record = ingest(recent_event())
    assert not stripe_sync.stripe_enabled()
    assert tasks.stripe_report_usage([record.pk]) == 0 and tasks.stripe_report_pending() == 0
    invoice = services.invoice_finalize(invoice=services.invoice_draft_build(tenant=tenant, month=record.created_at.date()))
    assert tasks.stripe_invoice_sync(invoice.pk) == "disabled"
    assert invoice.status == "finalized"  # invoicing works without Stripe


def test_one_customer_per_tenant(fake_stripe, tenant):
    first = stripe_sync.customer_ensure(tenant=tenant)
    assert stripe_sync.customer_ensure(tenant=tenant) == first
    assert len(fake_stripe.posts("/v1/customers")) == 1
    request = fake_stripe.posts("/v1/customers")[0]
    assert request.headers["authorization"] == "Bearer sk_test_local"
    assert request.headers["idempotency-key"] == f"tessera-customer-{tenant.pk}"
    assert request.params["metadata[tessera_tenant_id]"] == str(tenant.pk)
    assert StripeCustomer.objects.get(tenant=tenant).stripe_customer_id == first


def test_meter_events_per_meter_with_the_usage_id(fake_stripe, recent_event, ingest):
    record = ingest(recent_event(prompt_tokens=1000, cached_tokens=200, completion_tokens=300))
    assert stripe_sync.usage_report(record_ids=[record.pk]) == 1
    events = fake_stripe.state.meter_events
    assert set(events) == {f"tessera-usage-{record.pk}-{m}" for m in ("input", "cached_input", "output")}
    values = {e["event_name"]: e["payload"]["value"] for e in events.values()}
    assert values == {"tessera_input_tokens": "800", "tessera_cached_input_tokens": "200", "tessera_output_tokens": "300"}
    assert all(e["payload"]["stripe_customer_id"].startswith("cus_") for e in events.values())
    assert keys(fake_stripe, "/v1/billing/meter_events") == list(events)  # Idempotency-Key = identifier
    record.refresh_from_db()
    assert record.stripe_reported_at is not None
    assert stripe_sync.usage_report(record_ids=[record.pk]) == 0  # reported records are skipped
    assert len(fake_stripe.posts("/v1/billing/meter_events")) == 3


def test_zero_meters_are_not_sent(fake_stripe, recent_event, ingest):
    record = ingest(recent_event(prompt_tokens=10, cached_tokens=0, completion_tokens=0))
    stripe_sync.usage_report(record_ids=[record.pk])
    assert list(fake_stripe.state.meter_events) == [f"tessera-usage-{record.pk}-input"]


def test_lost_response_is_retried_by_the_sdk_without_duplicates(fake_stripe, recent_event, ingest):
    record = ingest(recent_event())
    fake_stripe.fail("/v1/billing/meter_events", after_processing=True, times=1)  # Stripe applied it; the reply is lost
    stripe_sync.usage_report(record_ids=[record.pk])
    assert len(fake_stripe.state.meter_events) == 3 and fake_stripe.state.duplicate_meter_events == []
    assert [r.replayed for r in fake_stripe.posts("/v1/billing/meter_events")].count(True) == 1


def test_task_retry_after_partial_progress_does_not_duplicate(fake_stripe, recent_event, ingest, eager_celery):
    """input and cached_input go through, output fails past the SDK's own retries: the Celery task
    retries (autoretry_for), re-sends the first two under the same keys (replayed) and finishes."""
    record = ingest(recent_event())
    fake_stripe.fail("/v1/billing/meter_events", times=3, status=503, match=lambda p: p["identifier"].endswith("-output"))
    result = tasks.stripe_report_usage.delay([record.pk])
    assert result.get() == 1
    assert len(fake_stripe.state.meter_events) == 3 and fake_stripe.state.duplicate_meter_events == []
    replayed = [r.params["identifier"] for r in fake_stripe.posts("/v1/billing/meter_events") if r.replayed]
    assert sorted(replayed) == sorted(f"tessera-usage-{record.pk}-{m}" for m in ("input", "cached_input"))
    record.refresh_from_db()
    assert record.stripe_reported_at is not None


def test_stripe_outage_leaves_usage_pending_and_serving_unaffected(fake_stripe, recent_event, ingest):
    fake_stripe.fail("/v1/customers", times=10, status=500)
    record = ingest(recent_event())  # the ledger write never talks to Stripe
    with pytest.raises(stripe.APIError):
        stripe_sync.usage_report(record_ids=[record.pk])
    record.refresh_from_db()
    assert record.stripe_reported_at is None and stripe_sync.usage_pending_ids(limit=10) == [record.pk]
    assert tasks.RETRY["acks_late"] and stripe.APIError in tasks.RETRY["autoretry_for"]


def test_after_the_idempotency_window_a_resend_is_recognised(fake_stripe, recent_event, ingest):
    record = ingest(recent_event())
    stripe_sync.usage_report(record_ids=[record.pk])
    UsageRecord.objects.filter(pk=record.pk).update(stripe_reported_at=None)  # crashed before marking
    fake_stripe.forget_idempotency_keys()  # ... and came back more than 24 h later
    assert stripe_sync.usage_report(record_ids=[record.pk]) == 1
    assert len(fake_stripe.state.meter_events) == 3  # Stripe refused the duplicates; we count them as done


def test_refused_event_is_marked_not_retried_forever(fake_stripe, recent_event, ingest):
    record = ingest(recent_event())
    fake_stripe.fail("/v1/billing/meter_events", status=400)
    assert stripe_sync.usage_report(record_ids=[record.pk]) == 0
    record.refresh_from_db()
    assert record.stripe_report_error and stripe_sync.usage_pending_ids(limit=10) == []


def test_records_too_old_for_meter_events_are_marked(fake_stripe, make_event, ingest, price):
    record = ingest(make_event(created_at=datetime(2026, 11, 2, tzinfo=UTC)))
    UsageRecord.objects.filter(pk=record.pk).update(created_at=timezone.now() - timedelta(days=40))
    assert stripe_sync.usage_report(record_ids=[record.pk]) == 0
    assert fake_stripe.posts("/v1/billing/meter_events") == []


def test_sweeper_queues_pending_usage(fake_stripe, recent_event, ingest, eager_celery):
    records = [ingest(recent_event()) for _ in range(3)]
    assert tasks.stripe_report_pending.delay().get() == 3
    assert UsageRecord.objects.filter(stripe_reported_at__isnull=True).count() == 0
    assert len(fake_stripe.state.meter_events) == 9 and len(records) == 3


@pytest.fixture
def finalized(price, make_event, ingest, tenant):
    for tokens in (1_234_567, 7_654_321):
        ingest(make_event(prompt_tokens=tokens, cached_tokens=1000, completion_tokens=tokens // 3))
    draft = services.invoice_draft_build(tenant=tenant, month=price.effective_from.date())
    services.invoice_line_add(invoice=draft, kind="credit", description="credit", amount=Decimal("-0.50"))
    return services.invoice_finalize(invoice=draft)


def test_invoice_is_mirrored_with_one_item_per_line(fake_stripe, finalized):
    invoice = stripe_sync.invoice_push(invoice_id=finalized.pk)
    assert invoice.stripe_status == "open" and invoice.stripe_invoice_id.startswith("in_")
    remote = fake_stripe.state.invoices[invoice.stripe_invoice_id]
    assert remote["metadata"]["tessera_invoice_id"] == str(finalized.pk)
    assert remote["total"] == int(finalized.total * 100)  # cents, Σ items, equals our total
    items = sorted(i["amount"] for i in fake_stripe.state.invoice_items.values())
    assert items == sorted(int(a * 100) for a in finalized.lines.values_list("amount", flat=True))
    assert min(items) == -50  # the credit
    assert keys(fake_stripe, "/v1/invoices") == [f"tessera-invoice-{finalized.pk}", f"tessera-invoice-finalize-{finalized.pk}"]
    before = len(fake_stripe.state.requests)
    stripe_sync.invoice_push(invoice_id=finalized.pk)  # already done: no calls at all
    assert len(fake_stripe.state.requests) == before


def test_invoice_push_resumes_after_a_crash_between_steps(fake_stripe, finalized):
    second_item = finalized.lines.order_by("id")[1].pk
    fake_stripe.fail("/v1/invoiceitems", times=3, status=500,
                     match=lambda p: p["metadata[tessera_invoice_line_id]"] == str(second_item))
    with pytest.raises(stripe.APIError):
        stripe_sync.invoice_push(invoice_id=finalized.pk)
    assert InvoiceLine.objects.exclude(stripe_invoice_item_id="").count() == 1  # progress was saved
    stripe_sync.invoice_push(invoice_id=finalized.pk)
    assert len(fake_stripe.state.invoices) == 1
    assert len(fake_stripe.state.invoice_items) == finalized.lines.count()


def test_invoice_push_after_losing_our_own_write_reuses_stripes_objects(fake_stripe, finalized):
    stripe_sync.invoice_push(invoice_id=finalized.pk)
    # as if the worker died after Stripe answered but before we saved anything
    Invoice.objects.filter(pk=finalized.pk).update(stripe_invoice_id="", stripe_status="")
    InvoiceLine.objects.filter(invoice=finalized).update(stripe_invoice_item_id="")
    stripe_sync.invoice_push(invoice_id=finalized.pk)
    assert len(fake_stripe.state.invoices) == 1  # same keys, replayed answers
    assert len(fake_stripe.state.invoice_items) == finalized.lines.count()


def test_finalize_enqueues_the_sync_on_commit(fake_stripe, price, make_event, ingest, tenant, eager_celery,
                                             django_capture_on_commit_callbacks):
    ingest(make_event())
    draft = services.invoice_draft_build(tenant=tenant, month=price.effective_from.date())
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        services.invoice_finalize(invoice=draft)
        assert fake_stripe.posts() == []  # nothing is sent before the commit
    assert len(callbacks) == 1
    draft.refresh_from_db()
    assert draft.stripe_status == "open"


def test_broker_failure_does_not_undo_finalizing(settings, price, make_event, ingest, tenant, monkeypatch,
                                                  django_capture_on_commit_callbacks):
    settings.STRIPE_API_KEY = "sk_test_local"

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(tasks.stripe_invoice_sync, "delay", broker_down)
    ingest(make_event())
    draft = services.invoice_draft_build(tenant=tenant, month=price.effective_from.date())
    with django_capture_on_commit_callbacks(execute=True):
        invoice = services.invoice_finalize(invoice=draft)
    assert invoice.status == "finalized"
    assert stripe_sync.invoices_pending_ids(limit=10) == [invoice.pk]  # the sweeper will send it


def test_void_is_pushed(fake_stripe, finalized, eager_celery, django_capture_on_commit_callbacks):
    stripe_sync.invoice_push(invoice_id=finalized.pk)
    with django_capture_on_commit_callbacks(execute=True):
        services.invoice_void(invoice=finalized, reason="mistake")
    finalized.refresh_from_db()
    assert finalized.stripe_status == "void"
    assert fake_stripe.state.invoices[finalized.stripe_invoice_id]["status"] == "void"
    assert keys(fake_stripe, f"/v1/invoices/{finalized.stripe_invoice_id}/void") == [f"tessera-invoice-void-{finalized.pk}"]
