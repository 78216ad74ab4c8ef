"""The finance role: a Django group with view-only permissions; admin lists with filters and totals."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group

from billing import services
from billing.models import Price

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def urls(settings):
    settings.ROOT_URLCONF = "tests.billing.urls"


@pytest.fixture
def finance(client, make_user):
    user = make_user("fin", role="finance")
    client.force_login(user)
    return client


@pytest.fixture
def billed(price, make_event, ingest, tenant):
    for tokens in (1000, 2000, 3000):
        ingest(make_event(prompt_tokens=tokens, cached_tokens=0, completion_tokens=0))
    services.usage_daily_rebuild(day=datetime(2026, 11, 10).date())
    return services.invoice_finalize(invoice=services.invoice_draft_build(tenant=tenant, month=price.effective_from.date()))


def test_finance_group_is_view_only():
    group = Group.objects.get(name="finance")
    codenames = set(group.permissions.values_list("codename", flat=True))
    assert {"view_price", "view_usagerecord", "view_usagedaily", "view_invoice", "view_invoiceline"} <= codenames
    assert all(code.startswith("view_") for code in codenames)
    services.finance_group_ensure()  # idempotent
    assert set(group.permissions.values_list("codename", flat=True)) == codenames


@pytest.mark.parametrize("model", ["usagerecord", "usagedaily", "invoice", "price", "stripeevent"])
def test_finance_reads_every_list_with_totals(finance, billed, model):
    response = finance.get(f"/admin/billing/{model}/")
    assert response.status_code == 200
    if model in ("usagerecord", "usagedaily", "invoice"):
        assert b'id="billing-totals"' in response.content


def test_totals_follow_the_filters(finance, billed, make_tenant, make_event, ingest):
    other = make_tenant()
    ingest(make_event(tenant_id=other.pk, api_key_id=None, prompt_tokens=5000, cached_tokens=0, completion_tokens=0))
    response = finance.get(f"/admin/billing/usagerecord/?tenant__id__exact={billed.tenant_id}")
    totals = dict(response.context["billing_totals"])
    assert totals["requests"] == 3 and totals["prompt tokens"] == 6000
    assert totals["amount"] == Decimal("6000") * Decimal("0.15") / 1_000_000
    everything = dict(finance.get("/admin/billing/usagerecord/").context["billing_totals"])
    assert everything["requests"] == 4
    invoices = dict(finance.get("/admin/billing/invoice/?status__exact=finalized").context["billing_totals"])
    assert invoices == {"invoices": 1, "total": billed.total}


def test_finance_cannot_change_anything(finance, billed, price):
    assert finance.get("/admin/billing/price/add/").status_code == 403
    page = finance.get(f"/admin/billing/price/{price.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content  # a read-only view
    response = finance.post(f"/admin/billing/price/{price.pk}/change/", {"input_per_mtok": "0"})
    assert response.status_code == 403
    response = finance.post("/admin/billing/invoice/", {"action": "void", "_selected_action": [billed.pk]})
    billed.refresh_from_db()
    assert billed.status == "finalized"
    assert finance.get(f"/admin/billing/invoice/{billed.pk}/delete/").status_code == 403


def test_operators_add_prices_through_the_service(admin_client, price):
    response = admin_client.post("/admin/billing/price/add/", {
        "model": price.model, "adapter": "", "tier": "", "currency": "usd", "input_per_mtok": "0.2",
        "cached_input_per_mtok": "0.1", "output_per_mtok": "0.8",
        "effective_from_0": "2026-11-20", "effective_from_1": "00:00:00", "note": "Black Friday",
    })
    assert response.status_code == 302, response.content[:2000]
    price.refresh_from_db()
    assert price.effective_to == datetime(2026, 11, 20, tzinfo=UTC)  # the old price was closed
    assert Price.objects.count() == 2
    overlapping = admin_client.post("/admin/billing/price/add/", {
        "model": price.model, "adapter": "", "tier": "", "currency": "usd", "input_per_mtok": "1",
        "cached_input_per_mtok": "1", "output_per_mtok": "1",
        "effective_from_0": "2026-11-02", "effective_from_1": "00:00:00", "effective_to_0": "2026-11-25",
        "effective_to_1": "00:00:00",
    })
    assert overlapping.status_code == 200 and b"overlaps" in overlapping.content


def test_operators_finalize_from_the_admin(admin_client, price, make_event, ingest, tenant):
    ingest(make_event())
    draft = services.invoice_draft_build(tenant=tenant, month=price.effective_from.date())
    admin_client.post("/admin/billing/invoice/", {"action": "finalize", "_selected_action": [draft.pk]})
    draft.refresh_from_db()
    assert draft.status == "finalized"
