"""Celery task contracts (ids in, idempotent, acks late, bounded retries) and the invoice commands."""

import io
from datetime import date

import pytest
from django.core.management import call_command

from billing import services, stripe_sync, tasks
from billing.models import Invoice

pytestmark = pytest.mark.django_db

ALL_TASKS = [tasks.stripe_report_usage, tasks.stripe_report_pending, tasks.stripe_invoice_sync, tasks.stripe_invoice_void,
             tasks.stripe_sync_pending, tasks.usage_daily_rollup, tasks.invoices_build_month]


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_task_options(task):
    assert task.acks_late is True
    assert task.max_retries == 8 and task.retry_backoff is True
    assert set(stripe_sync.RETRYABLE_ERRORS) <= set(task.autoretry_for)
    assert task.name.startswith("billing.")


def test_build_month_task_is_idempotent(price, make_event, ingest, tenant):
    ingest(make_event())
    first = tasks.invoices_build_month("2026-11", finalize=True)
    assert tasks.invoices_build_month("2026-11", finalize=True) == []
    assert Invoice.objects.get(pk=first[0]).status == "finalized"


def test_stripe_sweeper_requeues_unsynced_invoices(fake_stripe, price, make_event, ingest, tenant, eager_celery,
                                                   no_retry_sleep):
    ingest(make_event())
    invoice = services.invoice_finalize(invoice=services.invoice_draft_build(tenant=tenant, month=date(2026, 11, 1)))
    assert tasks.stripe_sync_pending.delay().get() == 1
    invoice.refresh_from_db()
    assert invoice.stripe_status == "open"
    assert tasks.stripe_sync_pending.delay().get() == 0


def test_billing_invoices_command(price, make_event, ingest, tenant):
    ingest(make_event())
    out = io.StringIO()
    call_command("billing_invoices", "--month", "2026-11", stdout=out)
    assert "\tdraft\t" in out.getvalue()
    call_command("billing_invoices", "--month", "2026-11", "--finalize", stdout=out)
    assert Invoice.objects.get().status == "finalized"
