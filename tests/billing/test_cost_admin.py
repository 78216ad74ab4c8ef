"""The cost of serving in the admin: operators add rates through the service (audited), finance reads
rates and costs, nobody edits them; the replica-hours list draws the month's charts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from tests.billing.cost_fixtures import rate, span

pytestmark = pytest.mark.django_db
H = datetime(2026, 11, 10, 12, tzinfo=UTC)


@pytest.fixture(autouse=True)
def urls(settings):
    settings.ROOT_URLCONF = "tests.billing.urls"


@pytest.fixture
def costed(make_price, make_event, ingest):
    from billing.services import cost_hours_rebuild

    make_price()
    rate(start=H - timedelta(days=1))
    span(started_at=H, last_seen_at=H + timedelta(hours=3))
    ingest(make_event(created_at=H + timedelta(minutes=3), worker_url="http://w1:8000"))
    cost_hours_rebuild(start=H, end=H + timedelta(hours=3))


def _form(**overrides):
    data = {"worker_class": "H100", "currency": "usd", "hourly_cost": "3.60", "prefill_tokens_per_second": "8000",
            "decode_tokens_per_second": "400", "effective_from_0": "2026-11-01", "effective_from_1": "00:00:00",
            "effective_to_0": "", "effective_to_1": "", "note": ""}
    data.update(overrides)
    return data


def test_an_operator_adds_a_rate_through_the_service_and_it_is_audited(client, make_user):
    from billing.models import WorkerClassRate
    from controlplane.audit.models import AuditEvent

    client.force_login(make_user("olga", role="operator"))
    response = client.post("/admin/billing/workerclassrate/add/", _form())
    assert response.status_code == 302, response.content[:500]
    assert AuditEvent.objects.filter(action="worker_rate.create").count() == 1
    response = client.post("/admin/billing/workerclassrate/add/", _form(effective_from_1="00:30:00"))
    assert response.status_code == 200 and b"on the hour" in response.content
    response = client.post("/admin/billing/workerclassrate/add/", _form(decode_tokens_per_second="0"))
    assert response.status_code == 200
    assert WorkerClassRate.objects.count() == 1
    rate_id = WorkerClassRate.objects.get().pk
    client.post(f"/admin/billing/workerclassrate/{rate_id}/change/", _form(hourly_cost="0.01"))
    assert WorkerClassRate.objects.get().hourly_cost == Decimal("3.60")  # never edited


def test_finance_reads_rates_and_costs_and_sees_the_charts(client, make_user, costed):
    client.force_login(make_user("fiona", role="finance"))
    for model in ("workerclassrate", "replicaspan", "replicahourcost", "requestcost"):
        assert client.get(f"/admin/billing/{model}/").status_code == 200, model
    assert client.get("/admin/billing/workerclassrate/add/").status_code == 403
    response = client.get("/admin/billing/replicahourcost/?hour__year=2026&hour__month=11")
    assert response.context["economics_month"] == "2026-11"
    charts = response.context["economics_charts"]
    assert len(charts) == 4 and all(svg.startswith("<svg") for svg in charts)
    assert "Cost (idle included) vs revenue per day" in charts[0] and "llama/H100" in charts[2]
    totals = dict(response.context["billing_totals"])
    assert totals["total cost"] == totals["attributed cost"] + totals["idle cost"] == Decimal("10.80")


def test_a_bad_month_in_the_filter_falls_back_to_this_month(client, make_user):
    client.force_login(make_user("fiona", role="finance"))
    response = client.get("/admin/billing/replicahourcost/?hour__year=99999&hour__month=77")
    assert response.status_code in (200, 302)


def test_staff_without_a_role_sees_none_of_it(client, make_user):
    client.force_login(make_user("sam", is_staff=True))
    for model in ("workerclassrate", "replicahourcost", "requestcost"):
        assert client.get(f"/admin/billing/{model}/").status_code == 403
