"""The tenant and deployment admin pages' read-only panels: what operators and finance see, that
finance cannot change anything there, and that each page's query count does not grow with the data."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import UsageRecord
from tenants import services

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def record(tenant, *, when, prompt=100, completion=50, amount="0.0100", status="ok", http_status=200,
           ttft_ms=100.0, itl_ms=20.0, currency="USD", tier=None):
    return UsageRecord.objects.create(
        request_id=uuid.uuid4().hex, tenant=tenant, model="m", tier=tier or tenant.tier.name, status=status,
        http_status=http_status, prompt_tokens=prompt, cached_tokens=0, completion_tokens=completion,
        ttft_ms=ttft_ms, itl_ms=itl_ms, latency_ms=500.0, created_at=when, currency=currency,
        amount=Decimal(amount),
    )


@pytest.fixture
def tenant(make_tier):
    tier = make_tier(name=f"gold-{uuid.uuid4().hex[:4]}", requests_per_minute=600, tokens_per_minute=100_000,
                     monthly_token_budget=10_000, monthly_spend_budget=Decimal("2.00"),
                     slo_ttft_p95_ms=500, slo_itl_p95_ms=50, slo_availability_pct=Decimal("99.5"))
    tenant = services.tenant_create(name=f"Panel Co {uuid.uuid4().hex[:4]}", tier=tier)
    tenant.requests_per_minute_override = 42
    tenant.save()
    return tenant


def panel(html: str, panel_id: str) -> str:
    match = re.search(rf'<fieldset class="module" id="{panel_id}">(.*?)</fieldset>', html, re.S)
    assert match, f"{panel_id} missing"
    return match.group(1)


@pytest.mark.parametrize("role", ["operator", "finance"])
def test_operator_and_finance_see_the_panels(tenant, make_user, role):
    now = timezone.now()
    record(tenant, when=now - dt.timedelta(minutes=5), prompt=3000, completion=1000, amount="0.5000")
    record(tenant, when=now - dt.timedelta(minutes=4), status="error", http_status=503, prompt=10, completion=0,
           amount="0", ttft_ms=None, itl_ms=None)
    record(tenant, when=now - dt.timedelta(days=3), ttft_ms=900.0)  # missed the 500 ms TTFT target
    created = services.api_key_create(tenant=tenant, name="batch-jobs", allowed_models=["m"])
    revoked = services.api_key_create(tenant=tenant, name="old-ci").key
    services.api_key_revoke(tenant=tenant, key=revoked)

    html = logged_in(make_user("u", role=role, is_staff=True)).get(
        f"/admin/tenants/tenant/{tenant.pk}/change/").content.decode()

    limits = panel(html, "panel-limits")
    assert re.search(r"requests per minute</td><td>42</td>\s*<td><b>override</b>", limits), limits
    assert re.search(rf"tokens per minute</td><td>100000</td>\s*<td>tier {tenant.tier.name}</td>", limits)
    assert "budget enforcement" in limits and "SLO: availability (%)" in limits

    usage = panel(html, "panel-usage")
    this_month = 4010 + (150 if (now - dt.timedelta(days=3)).month == now.month else 0)
    assert f"<td>tokens</td><td>{this_month}</td><td>10000</td>" in usage, usage
    assert 'role="meter"' in usage and "<svg" in usage and "Tokens per day (UTC)" in usage
    assert "Spend per day USD" in usage

    keys = panel(html, "panel-keys")
    assert created.key.prefix in keys and "batch-jobs" in keys and "m; any adapter" in keys
    assert revoked.prefix in keys and "revoked" in keys
    assert created.secret not in html
    # finance sees the key rows but has no keys permission: no links to a page it would be refused
    assert ("/admin/tenants/apikey/" in keys) is (role == "operator")

    slo = panel(html, "panel-slo")
    assert "availability" in slo and "time to first token" in slo and "99.5&thinsp;%" in slo
    assert "SLO attainment per day (UTC)" in slo and "<polyline" in slo
    assert "fast_burn" in slo  # one 5xx of two requests in the last hour burns far past 14.4


def test_finance_cannot_edit_from_the_tenant_page(tenant, make_user):
    client = logged_in(make_user("fin", role="finance", is_staff=True))
    url = f"/admin/tenants/tenant/{tenant.pk}/change/"
    html = client.get(url).content.decode()
    assert 'id="tenant-panels"' in html
    assert 'name="_save"' not in html and "<input" not in panel(html, "panel-keys")
    response = client.post(url, {"name": "renamed", "slug": tenant.slug, "tier": tenant.tier.pk,
                                 "requests_per_minute_override": "1"})
    assert response.status_code == 403
    tenant.refresh_from_db()
    assert tenant.requests_per_minute_override == 42 and tenant.name != "renamed"


def test_plain_staff_sees_no_panels(tenant, make_user):
    response = logged_in(make_user("staff", is_staff=True)).get(f"/admin/tenants/tenant/{tenant.pk}/change/")
    assert response.status_code == 403
    assert b"tenant-panels" not in response.content


def test_text_from_tenants_is_escaped_in_the_panels(tenant, make_user):
    services.api_key_create(tenant=tenant, name='<script>alert("k")</script>')
    html = logged_in(make_user("op", role="operator")).get(f"/admin/tenants/tenant/{tenant.pk}/change/").content.decode()
    assert '<script>alert("k")</script>' not in html and "&lt;script&gt;" in panel(html, "panel-keys")


def _tenant_page_queries(client, tenant, django_assert_max_num_queries, limit):
    with django_assert_max_num_queries(limit) as captured:
        assert client.get(f"/admin/tenants/tenant/{tenant.pk}/change/").status_code == 200
    return len(captured.captured_queries)


def test_the_tenant_page_query_count_does_not_grow_with_keys_or_traffic(
        tenant, make_user, django_assert_max_num_queries):
    client = logged_in(make_user("op", role="operator"))
    services.api_key_create(tenant=tenant, name="k0")
    record(tenant, when=timezone.now() - dt.timedelta(hours=1))
    small = _tenant_page_queries(client, tenant, django_assert_max_num_queries, 26)  # 22 measured

    now = timezone.now()
    for i in range(30):
        services.api_key_create(tenant=tenant, name=f"k{i + 1}")
    for day in range(30):
        record(tenant, when=now - dt.timedelta(days=day, minutes=1))
        record(tenant, when=now - dt.timedelta(days=day, minutes=2), currency="EUR")
    big = _tenant_page_queries(client, tenant, django_assert_max_num_queries, 26)
    assert big <= small, (small, big)  # the first view may seed the limiter's month: one more, never fewer


def test_the_deployment_page_shows_replicas_and_worker_health(make_user, django_assert_max_num_queries):
    from controlplane.deployments.models import Deployment, Model, Replica, Worker, WorkerStatus

    model = Model.objects.create(name=f"m-{uuid.uuid4().hex[:6]}", source="smollm2-135m-instruct")
    deployment = Deployment.objects.create(name=f"d-{uuid.uuid4().hex[:6]}", model=model, desired_replicas=3)
    now = timezone.now()
    healthy = Worker.objects.create(name="w-healthy", url="http://a:1", status=WorkerStatus.READY,
                                    last_heartbeat_at=now, kv_cache_usage=0.42, num_running=3)
    late = Worker.objects.create(name="w-late", url="http://b:1", status=WorkerStatus.READY,
                                 last_heartbeat_at=now - dt.timedelta(seconds=60))
    Replica.objects.create(deployment=deployment, worker=healthy, status="ready", ready_at=now)
    Replica.objects.create(deployment=deployment, worker=late, status="loading", attempt=2)
    Replica.objects.create(deployment=deployment, worker=None, status="pending")

    client = logged_in(make_user("op", role="operator"))
    url = f"/admin/deployments/deployment/{deployment.pk}/change/"
    with django_assert_max_num_queries(16) as few:  # 13 measured
        html = client.get(url).content.decode()
    replicas, workers = panel(html, "panel-replicas"), panel(html, "panel-workers")
    assert "1 ready of 3 desired" in replicas
    assert re.search(r"w-healthy</a></td>\s*<td class=\"health-healthy\">healthy</td>", replicas), replicas
    assert "missed heartbeats" in replicas and re.search(r"<td>6\d s ago</td>", replicas) and "no worker" in replicas
    assert "w-healthy" in workers and "w-late" in workers and "42&thinsp;%" in workers

    for i in range(20):  # more replicas on more workers: the same number of queries
        w = Worker.objects.create(name=f"w-{i}", url=f"http://c{i}:1", status=WorkerStatus.READY, last_heartbeat_at=now)
        Replica.objects.create(deployment=deployment, worker=w, status="ready")
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(url).status_code == 200

    # finance holds no deployment permission: no page, no panel
    assert logged_in(make_user("fin", role="finance", is_staff=True)).get(url).status_code == 403


def test_the_tenant_page_answers_from_the_ledger_when_the_limiters_redis_is_down(tenant, make_user, settings):
    from tenants.limits import reset_limiter

    record(tenant, when=timezone.now() - dt.timedelta(minutes=1), prompt=70, completion=30)
    settings.TESSERA_LIMITER, settings.REDIS_URL = "redis", "redis://127.0.0.1:1/0"  # nothing listens there
    settings.TESSERA_REDIS_TIMEOUT_SECONDS = 0.5
    reset_limiter()
    try:
        response = logged_in(make_user("op", role="operator")).get(f"/admin/tenants/tenant/{tenant.pk}/change/")
    finally:
        reset_limiter()
    usage = panel(response.content.decode(), "panel-usage")
    assert response.status_code == 200
    assert "<td>tokens</td><td>100</td>" in usage and "The limiter's count is unavailable right now." in usage
