"""In headless Chromium: an operator's change in the admin appears in the audit log with its actor;
finance reads the log with its filters and can neither add, change nor delete an event."""

from __future__ import annotations

import pytest

from tests.tenants.test_admin_browser import browser  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _sign_in(driver, base_url: str, username: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.delete_all_cookies()
    driver.get(f"{base_url}/admin/login/?next=/admin/")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys("pw")
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(driver, 30).until(lambda d: "/admin/login/" not in d.current_url or "errornote" in d.page_source)
    assert "/admin/login/" not in driver.current_url, driver.page_source[-2000:]


def _save(driver) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.controlplane.doors_browser import gone

    page = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.NAME, "_save").click()
    WebDriverWait(driver, 30).until(lambda d: gone(page))


def test_operator_change_is_audited_and_finance_reads_it_read_only(browser, live_server, make_user):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from controlplane.audit.models import AuditEvent
    from tenants import services

    small, large = services.tier_create(name="small-tier", priority=9), services.tier_create(name="large-tier", priority=1)
    tenant, created = services.tenant_create_with_key(name="Chrome Co", tier=small)
    make_user("op-chrome", role="operator")
    make_user("fin-chrome", role="finance")

    _sign_in(browser, live_server.url, "op-chrome")
    browser.get(f"{live_server.url}/admin/tenants/tenant/{tenant.pk}/change/")
    Select(browser.find_element(By.NAME, "tier")).select_by_visible_text("large-tier")
    _save(browser)
    event = AuditEvent.objects.get(action="tenant.update")
    assert event.changes == {"tier": [small.pk, large.pk]}
    assert (event.actor, event.channel) == ("user:op-chrome", "admin") and event.client_address == "127.0.0.1"

    _sign_in(browser, live_server.url, "fin-chrome")
    browser.get(f"{live_server.url}/admin/audit/auditevent/")
    page = browser.page_source
    for text in ("tenant.update", "user:op-chrome", "By action", "By channel", "By actor type"):
        assert text in page, text
    assert "/admin/audit/auditevent/add/" not in page and created.secret not in page
    browser.get(f"{live_server.url}/admin/audit/auditevent/{event.pk}/change/")
    page = browser.page_source
    assert "op-chrome" in page and 'name="_save"' not in page and "/delete/" not in page
    browser.get(f"{live_server.url}/admin/audit/auditevent/{event.pk}/delete/")
    assert "403" in browser.title or "Forbidden" in browser.page_source
    assert AuditEvent.objects.filter(pk=event.pk).exists()
