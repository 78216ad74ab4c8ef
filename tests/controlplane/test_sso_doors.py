"""What SSO changes at the other doors: password sign-in turned off, and the admin's second factor."""

from __future__ import annotations

import base64

import pytest

from tests.controlplane.sso_helpers import point_at, provider, sign_in  # noqa: F401  (provider: fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def sso(settings, provider):  # noqa: F811
    point_at(settings, provider)
    return provider


def _basic(username: str, password: str) -> dict:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()}


def test_with_password_login_on_the_page_offers_both(client, sso):
    page = client.get("/admin/login/").content.decode()
    assert 'name="password"' in page and "Sign in with SSO" in page
    assert 'href="/sso/login/?next=/admin/"' in page


def test_with_password_login_off_only_sso_is_offered_and_passwords_are_refused(client, sso, settings, make_user):
    from django.contrib.auth import authenticate
    from django.test import RequestFactory

    make_user("ops", role="operator", is_staff=True)
    signed_in = client.post("/admin/login/", {"username": "ops", "password": "pw", "next": "/admin/"})
    assert signed_in.status_code == 302 and signed_in["Location"] == "/admin/"  # before the switch
    assert authenticate(RequestFactory().post("/"), username="ops", password="pw") is not None
    assert client.get("/api/v1/tenants/", **_basic("ops", "pw")).status_code == 200
    client.logout()

    settings.TESSERA_ADMIN_PASSWORD_LOGIN = False
    page = client.get("/admin/login/").content.decode()
    assert 'name="password"' not in page and 'id="login-form"' not in page
    assert "Sign in with SSO" in page

    response = client.post("/admin/login/", {"username": "ops", "password": "pw", "next": "/admin/"})
    assert response.status_code == 403 and b"Password sign-in is turned off" in response.content
    assert client.get("/admin/").status_code == 302  # nothing signed in
    assert authenticate(RequestFactory().post("/"), username="ops", password="pw") is None  # backends too
    assert client.get("/api/v1/tenants/", **_basic("ops", "pw")).status_code == 401

    sso.user_claims.update(groups=["platform-ops"])
    assert sign_in(client)["Location"] == "/admin/"  # SSO still signs in
    assert client.get("/admin/").status_code == 200


def test_password_login_off_without_sso_is_a_settings_error(settings):
    from controlplane.sso.config import settings_errors

    settings.TESSERA_OIDC_ISSUER = ""
    settings.TESSERA_ADMIN_PASSWORD_LOGIN = False
    assert any("nobody could sign in" in error for error in settings_errors())


def test_an_sso_sign_in_counts_as_the_second_factor(client, sso, settings):
    settings.TESSERA_ADMIN_2FA_ROLES = ["operator", "finance"]
    sso.user_claims.update(groups=["platform-ops"])
    assert sign_in(client)["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200  # no TOTP code asked


def test_an_amr_without_mfa_leaves_the_second_factor_to_this_platform(client, sso, settings):
    settings.TESSERA_ADMIN_2FA_ROLES = ["operator", "finance"]
    settings.TESSERA_OIDC_MFA_AMR = ["hwk", "mfa"]
    sso.amr = ["pwd"]
    sso.user_claims.update(sub="weak-1", groups=["platform-ops"])
    sign_in(client)
    assert client.get("/admin/")["Location"].startswith("/admin/login/")
    assert client.get("/admin/login/")["Location"] in ("/admin/login/enrol/", "/admin/login/code/")

    client.logout()
    sso.amr = ["pwd", "hwk"]
    sign_in(client)
    assert client.get("/admin/").status_code == 200
