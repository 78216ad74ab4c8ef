"""The autoscaler's signals from the database: the 5-minute latency burn of the tiers a deployment
serves (from the request records, as the SLO selectors count them), and recent use."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from billing.events import UsageEvent
from billing.services import usage_record_ingest
from controlplane.deployments.autoscale.signals import fast_burn, recent_requests
from tenants import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def tiers():
    fast = services.tier_create(name=f"prem-{uuid.uuid4().hex[:6]}", priority=0, slo_ttft_p95_ms=200,
                                slo_itl_p95_ms=50)
    slow = services.tier_create(name=f"std-{uuid.uuid4().hex[:6]}", priority=5, slo_ttft_p95_ms=2000)
    return fast, slow


def record(tier, *, now, ttft=100.0, itl=20.0, ago_s=30, model="m1", batch=""):
    tenant = services.tenant_create(name=f"T {uuid.uuid4().hex[:6]}", tier=tier)
    usage_record_ingest(event=UsageEvent(
        request_id=f"r-{uuid.uuid4().hex}", tenant_id=tenant.pk, api_key_id=None, model=model, adapter=None,
        tier=tier.name, prompt_tokens=10, cached_tokens=0, completion_tokens=5, ttft_ms=ttft,
        latency_ms=ttft + 100, status="ok", created_at=now - dt.timedelta(seconds=ago_s), http_status=200,
        itl_ms=itl, batch_id=batch))


def test_the_worst_tier_s_latency_burn_over_five_minutes(tiers):
    fast, slow = tiers
    now = timezone.now()
    for i in range(20):  # premium: 4 of 20 over 200 ms -> 20 % bad / 5 % budget = burn 4
        record(fast, now=now, ttft=300.0 if i < 4 else 100.0)
    for _ in range(20):  # standard: all within 2 s
        record(slow, now=now, ttft=1500.0, itl=None)
    for _ in range(20):  # older than the window, all slow: not counted
        record(fast, now=now, ttft=5000.0, ago_s=400)
    for _ in range(20):  # another model's requests: not this deployment's
        record(fast, now=now, ttft=5000.0, model="other")
    assert fast_burn(model="m1", now=now) == pytest.approx(4.0)


def test_itl_counts_too_and_batch_lines_do_not():
    tier = services.tier_create(name=f"p-{uuid.uuid4().hex[:6]}", priority=0, slo_ttft_p95_ms=200, slo_itl_p95_ms=50)
    now = timezone.now()
    for i in range(20):
        record(tier, now=now, itl=80.0 if i < 10 else 20.0)  # half over 50 ms: burn 10
    for _ in range(50):
        record(tier, now=now, ttft=9000.0, batch=f"batch_{uuid.uuid4().hex[:8]}")
    assert fast_burn(model="m1", now=now) == pytest.approx(10.0)


def test_too_few_requests_give_no_reading(tiers):
    fast, _ = tiers
    now = timezone.now()
    for _ in range(19):  # below TESSERA_AUTOSCALE_BURN_MIN_EVENTS (20): 19 slow requests say nothing yet
        record(fast, now=now, ttft=900.0)
    assert fast_burn(model="m1", now=now) is None
    assert recent_requests(model="m1", now=now) == 19 and recent_requests(model="other", now=now) == 0
