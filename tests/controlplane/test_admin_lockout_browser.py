"""The lockout as a person sees it in headless Chromium: the message after N failures, the right
password refused during the cool-down, and an operator's unlock from the command line."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from .doors_browser import browser, csp_violations, sign_in  # noqa: F401  (browser is a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_person_is_locked_out_and_an_operator_unlocks_them(browser, live_server, django_user_model, settings):  # noqa: F811
    settings.TESSERA_LOGIN_FAILURE_LIMIT = 3
    django_user_model.objects.create_superuser("admin", "admin@example.com", "right-password")

    for attempt in range(1, 3):
        sign_in(browser, live_server.url, "admin", f"wrong-{attempt}")
        assert "Please enter the correct username and password" in browser.page_source
        assert "Too many failed sign-ins" not in browser.page_source
    sign_in(browser, live_server.url, "admin", "wrong-3")
    assert "Too many failed sign-ins for this account or from this address" in browser.page_source
    assert "Sign-in is locked for 5 minutes" in browser.page_source

    sign_in(browser, live_server.url, "admin", "right-password")  # during the cool-down
    assert "Too many failed sign-ins" in browser.page_source
    assert "Site administration" not in browser.page_source

    call_command("login_unlock", "--username", "admin", stdout=io.StringIO())
    sign_in(browser, live_server.url, "admin", "right-password")
    assert "Site administration" in browser.page_source, browser.page_source[-2000:]
    assert csp_violations(browser) == []
