"""Single sign-on in headless Chromium: the live control plane, a real OpenID Connect provider, a person
clicking "Sign in with SSO" and landing in the admin with what their provider groups map to."""

from __future__ import annotations

import pytest

from tests.controlplane.oidc_provider import OIDCProvider
from tests.controlplane.sso_helpers import point_at
from tests.tenants.test_admin_browser import browser  # noqa: F401  (fixture: headless Chromium)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def live_provider(live_server, settings):
    started = OIDCProvider(redirect_uris=[f"{live_server.url}/sso/callback/"]).start()
    point_at(settings, started)
    yield started
    started.stop()


def _click_sso(browser, live_server) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.delete_all_cookies()
    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.LINK_TEXT, "Sign in with SSO").click()
    # Chromium goes to the provider, which approves at once and sends it back to /sso/callback/.
    WebDriverWait(browser, 30).until(
        lambda d: d.current_url.startswith(live_server.url) and "/sso/" not in d.current_url
        and ("Site administration" in d.page_source or "messagelist" in d.page_source))


def test_sign_in_with_sso_as_operator_then_finance_then_nothing(browser, live_server, live_provider):  # noqa: F811
    from controlplane.sso.models import OIDCIdentity

    live_provider.user_claims.update(sub="person-7", preferred_username="ines", groups=["platform-ops"])
    _click_sso(browser, live_server)
    assert browser.current_url == f"{live_server.url}/admin/", browser.page_source[-1500:]
    assert "Site administration" in browser.page_source and "ines" in browser.page_source
    browser.get(f"{live_server.url}/admin/tenants/apikey/add/")
    assert "Allowed models" in browser.page_source  # an operator may add keys

    live_provider.user_claims["groups"] = ["finance-team"]
    _click_sso(browser, live_server)
    assert "Site administration" in browser.page_source
    browser.get(f"{live_server.url}/admin/billing/invoice/")
    assert "Select invoice to view" in browser.page_source  # finance reads invoices, read-only
    browser.get(f"{live_server.url}/admin/tenants/apikey/add/")
    assert "Allowed models" not in browser.page_source and "403" in browser.title + browser.page_source

    live_provider.user_claims["groups"] = []
    _click_sso(browser, live_server)
    assert browser.current_url.startswith(f"{live_server.url}/admin/login/")
    assert "no longer holds a role" in browser.page_source
    user = OIDCIdentity.objects.get(subject="person-7").user
    assert not user.is_staff and user.groups.count() == 0


def test_with_password_login_off_the_page_is_one_button(browser, live_server, live_provider, settings):  # noqa: F811
    from selenium.webdriver.common.by import By

    settings.TESSERA_ADMIN_PASSWORD_LOGIN = False
    browser.get(f"{live_server.url}/admin/login/")
    assert browser.find_elements(By.NAME, "password") == []
    assert browser.find_element(By.LINK_TEXT, "Sign in with SSO").is_displayed()
    live_provider.user_claims.update(groups=["finance-team"])
    _click_sso(browser, live_server)
    assert "Site administration" in browser.page_source
