"""Two-factor sign-in as a person sees it in headless Chromium: password then code, a wrong code
refused, a recovery code good once, and an operator who must enrol before any admin page opens."""

from __future__ import annotations

import base64

import pytest
from django_otp.oath import totp

from controlplane.doors import twofactor

from .doors_browser import browser, csp_violations, sign_in, submit  # noqa: F401  (browser is a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _code(key: bytes, device=None) -> str:
    if device is not None:
        device.refresh_from_db()
        return f"{totp(device.bin_key, device.step, device.t0, device.digits, device.drift):06d}"
    return f"{totp(key):06d}"


def test_password_then_code_and_a_recovery_code_once(browser, live_server, make_user, settings):  # noqa: F811
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    settings.OTP_STATIC_THROTTLE_FACTOR = 0
    user = make_user("carol", role="operator")
    device, codes = twofactor.otp_enrol(user)

    sign_in(browser, live_server.url, "carol", "pw")
    assert browser.current_url.endswith("/admin/login/code/")
    assert "Enter the 6-digit code" in browser.page_source
    right = _code(b"", device)
    submit(browser, {"code": f"{(int(right) + 500000) % 1000000:06d}"})
    assert "That code is not right" in browser.page_source
    assert "Site administration" not in browser.page_source
    submit(browser, {"code": right})
    assert "Site administration" in browser.page_source, browser.page_source[-2000:]
    browser.get(f"{live_server.url}/admin/tenants/tenant/")
    assert "Select tenant to change" in browser.page_source
    # The admin's scripted pages (prepopulated slug, inlines, filters, actions) run under the policy.
    for path in ("/admin/tenants/tenant/add/", "/admin/tenants/apikey/add/", "/admin/tenants/tier/",
                 "/admin/axes/accessattempt/"):
        browser.get(f"{live_server.url}{path}")
        assert "Server Error" not in browser.page_source, path
    assert csp_violations(browser) == []

    for attempt in ("first", "second"):
        browser.delete_all_cookies()
        sign_in(browser, live_server.url, "carol", "pw")
        submit(browser, {"code": codes[0]})
        if attempt == "first":
            assert "Site administration" in browser.page_source
        else:
            assert "That code is not right" in browser.page_source
    assert csp_violations(browser) == []


def test_an_operator_enrols_before_any_admin_page_opens(browser, live_server, make_user, settings):  # noqa: F811
    from selenium.webdriver.common.by import By

    settings.TESSERA_ADMIN_2FA_ROLES = ["operator"]
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    make_user("ops", role="operator")

    sign_in(browser, live_server.url, "ops", "pw")
    assert browser.current_url.endswith("/admin/login/enrol/")
    assert browser.find_element(By.CSS_SELECTOR, "#enrol-qr svg").is_displayed()
    browser.get(f"{live_server.url}/admin/tenants/tenant/")  # not signed in yet
    assert "/admin/login/" in browser.current_url and "Select tenant" not in browser.page_source

    sign_in(browser, live_server.url, "ops", "pw")
    secret = browser.find_element(By.ID, "enrol-secret").text
    key = base64.b32decode(secret + "=" * (-len(secret) % 8))
    submit(browser, {"code": "000000" if _code(key) != "000000" else "111111"})
    assert "That code is not right" in browser.page_source
    submit(browser, {"code": _code(key)})
    codes = [item.text for item in browser.find_elements(By.CSS_SELECTOR, "#recovery-codes li")]
    assert len(codes) == 10
    browser.find_element(By.ID, "continue").click()
    browser.get(f"{live_server.url}/admin/tenants/tenant/")
    assert "Select tenant to change" in browser.page_source, browser.page_source[-2000:]
    assert csp_violations(browser) == []
