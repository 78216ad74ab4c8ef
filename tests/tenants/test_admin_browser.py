"""The operators' admin pages render in headless Chromium (list displays, filters, search, forms)."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _seeded_tier(name: str):
    """The seeded tier, re-seeded when an earlier transactional test flushed the migration's rows."""
    from importlib import import_module

    from django.apps import apps

    from tenants.models import Tier

    if not Tier.objects.filter(name=name).exists():
        import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)
    return Tier.objects.get(name=name)


@pytest.fixture
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_admin_pages_render(browser, live_server, django_user_model):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tenants import services

    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    tenant, created = services.tenant_create_with_key(name="Acme Corp", tier=_seeded_tier("premium"))
    services.api_key_create(tenant=tenant, name="batch-jobs", allowed_models=["smollm2-135m-instruct"])

    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # click() returns before the POST's answer is loaded: wait for the next page, not for a fixed time.
    WebDriverWait(browser, 30).until(lambda d: "/admin/login/" not in d.current_url
                                     or "errornote" in d.page_source)
    assert "Site administration" in browser.page_source, browser.page_source[-2000:]

    pages = {
        "/admin/tenants/tier/": ["free", "standard", "premium", "enterprise", "By budget enforcement"],
        "/admin/tenants/tenant/": ["acme-corp", "Active", "By status", "By tier"],
        "/admin/tenants/tenant/?q=acme": ["acme-corp"],
        f"/admin/tenants/tenant/{tenant.pk}/change/": ["Overrides (blank = inherit from the tier)", created.key.prefix],
        "/admin/tenants/apikey/": ["batch-jobs", "smollm2-135m-instruct", "By revoked", created.key.prefix],
        "/admin/tenants/apikey/add/": ["Allowed models", "Can manage"],
    }
    for path, expected in pages.items():
        browser.get(f"{live_server.url}{path}")
        source = browser.page_source
        assert "Server Error" not in source and "Traceback" not in source, path
        for text in expected:
            assert text in source, (path, text)
        assert created.secret not in source  # the secret is never shown again


def _log_in(browser, live_server, username: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys(username)
    browser.find_element(By.NAME, "password").send_keys("pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 30).until(lambda d: "/admin/login/" not in d.current_url or "errornote" in d.page_source)


def test_an_operator_ticks_can_manage_and_it_saves(browser, live_server, make_user):
    """The checkbox showed as editable and was silently dropped on save."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tenants import services
    from tenants.models import APIKey

    make_user("ops", role="operator", is_staff=True)
    tenant = services.tenant_create(name="Checkbox Co", tier=_seeded_tier("standard"))
    key = services.api_key_create(tenant=tenant, name="ci").key
    assert not key.can_manage
    _log_in(browser, live_server, "ops")
    browser.get(f"{live_server.url}/admin/tenants/apikey/{key.pk}/change/")
    box = browser.find_element(By.NAME, "can_manage")
    assert box.is_enabled() and not box.is_selected()
    box.click()
    browser.find_element(By.NAME, "_save").click()
    WebDriverWait(browser, 30).until(lambda d: "/change/" not in d.current_url or "errornote" in d.page_source)
    assert "errornote" not in browser.page_source, browser.page_source[-2000:]
    assert "was changed successfully" in browser.page_source
    assert APIKey.objects.get(pk=key.pk).can_manage


def test_finance_cannot_open_a_keys_change_page(browser, live_server, make_user):
    from tenants import services

    make_user("money", role="finance", is_staff=True)
    tenant = services.tenant_create(name="Ledger Co", tier=_seeded_tier("standard"))
    key = services.api_key_create(tenant=tenant, name="ci").key
    _log_in(browser, live_server, "money")
    browser.get(f"{live_server.url}/admin/tenants/apikey/{key.pk}/change/")
    assert "can_manage" not in browser.page_source and "403" in browser.title + browser.page_source
