"""/api/v1/billing/worker-rates: operators add rates (audited, through the service); finance reads."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db
URL = "/api/v1/billing/worker-rates"
BODY = {"worker_class": "H100", "hourly_cost": "3.60", "prefill_tokens_per_second": "8000",
        "decode_tokens_per_second": "400", "effective_from": "2026-11-01T00:00:00Z"}


@pytest.fixture(autouse=True)
def urls(settings):
    settings.ROOT_URLCONF = "tests.billing.urls"


def test_an_operator_adds_and_changes_a_rate(client, make_user):
    from controlplane.audit.models import AuditEvent

    client.force_login(make_user("olga", role="operator"))
    first = client.post(URL, BODY, content_type="application/json")
    assert first.status_code == 201 and first.json()["hourly_cost"] == "3.6000000000"
    second = client.post(URL, {**BODY, "hourly_cost": "4.10", "effective_from": "2026-11-16T00:00:00Z"},
                         content_type="application/json")
    assert second.status_code == 201
    rates = client.get(URL).json()["results"]
    assert [r["effective_to"] for r in rates] == [None, "2026-11-16T00:00:00Z"]
    assert AuditEvent.objects.filter(action__startswith="worker_rate.").count() == 3


@pytest.mark.parametrize("bad", [
    {"effective_from": "2026-11-01T00:30:00Z"}, {"hourly_cost": "-1"}, {"decode_tokens_per_second": "0"},
    {"worker_class": "a\x00b"}, {"worker_class": ""}, {"currency": "jpy"}, {"hourly_cost": "1e-11"},
    {"effective_from": "2026-11-01T00:00:00+05:30"}, {"effective_to": "2026-10-01T00:00:00Z"}, {"hourly_cost": "NaN"},
])
def test_bad_rates_are_400(client, make_user, bad):
    from billing.models import WorkerClassRate

    client.force_login(make_user("olga", role="operator"))
    response = client.post(URL, {**BODY, **bad}, content_type="application/json")
    assert response.status_code == 400, response.content
    assert WorkerClassRate.objects.count() == 0


def test_finance_reads_but_may_not_add(client, make_user):
    client.force_login(make_user("fiona", role="finance"))
    assert client.get(URL).status_code == 200
    assert client.post(URL, BODY, content_type="application/json").status_code == 403
