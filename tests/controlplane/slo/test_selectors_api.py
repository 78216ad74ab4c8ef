"""SLIs from request records: counts per window, what counts against availability, the API, admin, /metrics."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from billing.events import UsageEvent
from billing.services import usage_record_ingest
from controlplane.slo import selectors, sli
from tenants import services
from tenants.models import Tier

pytestmark = pytest.mark.django_db


@pytest.fixture
def tier():
    return services.tier_create(name=f"t-{uuid.uuid4().hex[:6]}", priority=5, slo_ttft_p95_ms=500,
                                slo_itl_p95_ms=50, slo_availability_pct="99.000")


def _tenant(tier, name):
    return services.tenant_create(name=f"{name} {uuid.uuid4().hex[:6]}", tier=tier)


def record(tenant, tier, *, ago_s=60, ttft=100.0, itl=20.0, status="ok", http=200, model="m1", now=None):
    now = now or timezone.now()
    usage_record_ingest(event=UsageEvent(
        request_id=f"r-{uuid.uuid4().hex}", tenant_id=tenant.pk, api_key_id=None, model=model, adapter=None,
        tier=tier.name, prompt_tokens=10, cached_tokens=0, completion_tokens=5 if ttft else 0, ttft_ms=ttft,
        latency_ms=(ttft or 0) + 100, status=status, created_at=now - dt.timedelta(seconds=ago_s),
        http_status=http, itl_ms=itl,
    ))


def test_counts_attainment_budget_and_percentiles_on_known_data(tier):
    now = timezone.now()
    acme = _tenant(tier, "Acme")
    # last hour: 20 requests, TTFT 100..2000 ms in steps of 100 (5 of 20 within 500 ms), ITL all 20 ms
    for i in range(1, 21):
        record(acme, tier, ago_s=60, ttft=100.0 * i, now=now)
    # 2 days ago: 80 fast requests, 1 platform failure (500), 1 shed (429, not counted against us),
    # 1 client disconnect (499), 1 failure with no status recorded (counted against us)
    for _ in range(80):
        record(acme, tier, ago_s=2 * 86400, ttft=50.0, now=now)
    record(acme, tier, ago_s=2 * 86400, ttft=None, itl=None, status="error", http=500, now=now)
    record(acme, tier, ago_s=2 * 86400, ttft=None, itl=None, status="error", http=429, now=now)
    record(acme, tier, ago_s=2 * 86400, ttft=None, itl=None, status="partial", http=499, now=now)
    record(acme, tier, ago_s=2 * 86400, ttft=None, itl=None, status="error", http=None, now=now)
    # older than 30 days: ignored
    record(acme, tier, ago_s=31 * 86400, ttft=9999.0, status="error", http=500, now=now)

    [row] = [r for r in selectors.slo_status(now=now) if r.tenant == acme.slug]
    hour, day, month = row.windows["1h"], row.windows["24h"], row.windows["30d"]
    assert hour["ttft"]["total"] == 20 and hour["ttft"]["bad"] == 15
    assert hour["ttft"]["attainment"] == pytest.approx(0.25)
    assert hour["ttft"]["burn_rate"] == pytest.approx(0.75 / 0.05)
    assert hour["itl"]["attainment"] == 1.0
    assert hour["availability"]["attainment"] == 1.0
    assert day == hour  # nothing between 1 h and 24 h ago
    assert month["availability"]["total"] == 104 and month["availability"]["bad"] == 2
    assert month["availability"]["attainment"] == pytest.approx(102 / 104)
    assert month["ttft"]["total"] == 100 and month["ttft"]["bad"] == 15
    # budgets: availability 1% budget, 2/104 bad -> burn 1.923, remaining -0.923
    assert row.budget_remaining["availability"] == pytest.approx(1 - (2 / 104) / 0.01)
    assert row.budget_remaining["ttft"] == pytest.approx(1 - (15 / 100) / 0.05)
    assert row.p95_ms["1h"]["ttft"] == sli.percentile([100.0 * i for i in range(1, 21)], 95) == 1900.0
    assert row.p95_ms["1h"]["itl"] == 20.0
    assert "fast_burn" in row.alerts["ttft"]  # 15× over both 1 h and 5 m
    # the failures are 2 days old: the 3d window burns (1.9×) but the 6h one is clean, so no ticket
    assert row.windows["3d"]["availability"]["burn_rate"] > 1 and row.windows["6h"]["availability"]["bad"] == 0
    assert row.alerts["availability"] == []


def test_groups_by_tier_and_model_and_restricts_to_a_tenant(tier):
    now = timezone.now()
    a, b = _tenant(tier, "A"), _tenant(tier, "B")
    record(a, tier, model="m1", now=now)
    record(a, tier, model="m2", now=now)
    record(b, tier, model="m1", ttft=900.0, now=now)
    per_tier = [r for r in selectors.slo_status(group_by=("tier",), now=now) if r.tier == tier.name]
    assert len(per_tier) == 1 and per_tier[0].windows["1h"]["ttft"]["total"] == 3
    only_a = selectors.slo_status(tenant=a, now=now)
    assert {(r.tenant, r.model) for r in only_a} == {(a.slug, "m1"), (a.slug, "m2")}
    with pytest.raises(ValueError, match="group_by"):
        selectors.slo_status(group_by=("tenant",))


def test_api_operator_sees_all_tenant_sees_own(tier, client, make_user):
    now = timezone.now()
    a, b = _tenant(tier, "A"), _tenant(tier, "B")
    record(a, tier, now=now)
    record(b, tier, now=now)
    key = services.api_key_create(tenant=a, name="mgmt", can_manage=True).secret
    response = client.get("/api/v1/slo/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200
    tenants = {r["tenant"] for r in response.json()["results"]}
    assert tenants == {a.slug}
    row = response.json()["results"][0]
    assert set(row["windows"]) == {"1h", "24h", "30d"} and row["targets"]["ttft_p95_ms"] == 500
    assert set(row["burn_rates"]["availability"]) == set(sli.WINDOWS)

    plain = services.api_key_create(tenant=a, name="plain").secret
    assert client.get("/api/v1/slo/", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code in (401, 403)
    assert client.get("/api/v1/slo/").status_code in (401, 403)

    op = make_user("op", role="operator")
    client.force_login(op)
    everyone = {r["tenant"] for r in client.get("/api/v1/slo/").json()["results"]}
    assert {a.slug, b.slug} <= everyone
    by_tier = client.get("/api/v1/slo/?group=tier").json()["results"]
    assert any(r["tier"] == tier.name and r["tenant"] is None for r in by_tier)
    assert {r["tenant"] for r in client.get(f"/api/v1/slo/?tenant={b.slug}").json()["results"]} == {b.slug}


def test_admin_status_page_and_metrics(tier, admin_client, settings):
    from controlplane.slo.metrics import SLO_COLLECTOR

    settings.TESSERA_WORKERS = "http://127.0.0.1:9"
    acme = _tenant(tier, "Acme")
    record(acme, tier)
    record(acme, tier, ttft=None, itl=None, status="error", http=503)
    page = admin_client.get("/admin/slo/tierslo/")
    assert page.status_code == 200
    html = page.content.decode()
    assert tier.name in html and "50.00%" in html  # availability 1 of 2
    assert admin_client.get("/admin/slo/tierslo/add/").status_code == 403

    SLO_COLLECTOR.clear()
    text = admin_client.get("/metrics").content.decode()
    assert f'tessera_slo_attainment{{sli="availability",tier="{tier.name}",window="1h"}} 0.5' in text
    burn = next(line for line in text.splitlines()
                if line.startswith(f'tessera_slo_burn_rate{{sli="availability",tier="{tier.name}",window="1h"}}'))
    assert float(burn.split()[-1]) == pytest.approx(50.0)  # 50% bad on a 1% budget
    assert f'tessera_slo_objective{{sli="availability",tier="{tier.name}"}} 0.99' in text
    assert "tessera_gateway_worker_up" in text


def test_seeded_tiers_carry_availability_targets():
    assert Tier.objects.get(name="premium").slo_availability_pct is not None
