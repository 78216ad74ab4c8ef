"""What a person sees: the tenant page's panels and charts in headless Chromium, under the admin's CSP."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest

from tests.controlplane.doors_browser import browser, csp_violations, sign_in  # noqa: F401  (browser is a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_finance_sees_the_tenant_panels_and_charts(browser, live_server, make_user, make_tier):  # noqa: F811
    from django.utils import timezone
    from selenium.webdriver.common.by import By

    from billing.models import UsageRecord
    from tenants import services

    tier = make_tier(monthly_token_budget=1000, slo_availability_pct=Decimal("99.9"), slo_ttft_p95_ms=500)
    tenant = services.tenant_create(name="Chart Co", tier=tier)
    key = services.api_key_create(tenant=tenant, name="prod").key
    now = timezone.now()
    for day in (0, 1, 3):
        UsageRecord.objects.create(
            request_id=uuid.uuid4().hex, tenant=tenant, model="m", tier=tier.name, status="ok", http_status=200,
            prompt_tokens=200, cached_tokens=0, completion_tokens=100, ttft_ms=100.0, latency_ms=300.0,
            created_at=now - dt.timedelta(days=day, minutes=1), currency="USD", amount=Decimal("0.0300"))
    make_user("fin", role="finance", is_staff=True)

    browser.set_window_size(1300, 1000)  # a desktop: the charts draw at their full 640 px (narrower windows shrink them)
    sign_in(browser, live_server.url, "fin", "pw")
    browser.get(f"{live_server.url}/admin/tenants/tenant/{tenant.pk}/change/")
    for panel in ("panel-limits", "panel-usage", "panel-keys", "panel-slo"):
        assert browser.find_element(By.ID, panel).is_displayed(), panel
    assert key.prefix in browser.find_element(By.ID, "panel-keys").text

    usage_chart = browser.find_element(By.CSS_SELECTOR, "#panel-usage svg.tessera-chart")
    assert usage_chart.size["width"] >= 600 and usage_chart.size["height"] >= 150  # laid out, not collapsed
    bars = [b for b in usage_chart.find_elements(By.CSS_SELECTOR, "rect.bar") if b.size["height"] > 0]
    assert len(bars) == 3  # three days with traffic, drawn as three visible bars
    slo_chart = browser.find_element(By.CSS_SELECTOR, "#panel-slo svg.tessera-chart")
    assert slo_chart.find_elements(By.CSS_SELECTOR, "circle.point") and slo_chart.size["height"] >= 150
    meter = browser.find_element(By.CSS_SELECTOR, "#panel-usage [role=meter]")
    this_month = sum(300 for day in (0, 1, 3) if (now - dt.timedelta(days=day, minutes=1)).month == now.month)
    assert meter.get_attribute("aria-valuenow") == str(this_month * 100 // 1000)  # 900 of 1000 tokens mid-month
    assert not browser.find_elements(By.NAME, "_save")  # finance reads, never edits
    assert csp_violations(browser) == []
