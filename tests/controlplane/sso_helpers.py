"""Shared by the SSO tests: a started provider, the settings that point the control plane at it, and
one sign-in walked through Django's test client (the provider is reached over real HTTP)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests

from tests.controlplane.oidc_provider import OIDCProvider

ROLE_MAP = {"platform-ops": "operator", "finance-team": "finance"}


@pytest.fixture
def provider():
    started = OIDCProvider(redirect_uris=["http://testserver/sso/callback/"]).start()
    yield started
    started.stop()


def point_at(settings, provider: OIDCProvider) -> None:
    from controlplane.sso.config import forget_discovery

    settings.TESSERA_OIDC_ISSUER = provider.issuer
    settings.TESSERA_OIDC_CLIENT_ID = provider.client.client_id
    settings.TESSERA_OIDC_CLIENT_SECRET = provider.client.client_secret
    settings.TESSERA_OIDC_ROLE_CLAIM = "groups"
    settings.TESSERA_OIDC_ROLE_MAP = dict(ROLE_MAP)
    settings.TESSERA_OIDC_MFA_AMR = []
    settings.TESSERA_ADMIN_PASSWORD_LOGIN = True
    forget_discovery()


def to_provider(client, next_url: str = "") -> str:
    """GET /sso/login/: the authorization URL the browser is sent to."""
    response = client.get("/sso/login/", {"next": next_url} if next_url else {})
    assert response.status_code == 302, response.content[:500]
    return response["Location"]


def provider_answer(authorization_url: str) -> str:
    """What the provider redirects the browser to (the callback URL with code and state, or an error)."""
    response = requests.get(authorization_url, allow_redirects=False, timeout=10)
    assert response.status_code == 302, response.text[:500]
    return response.headers["Location"]


def callback(client, callback_url: str):
    parts = urlsplit(callback_url)
    assert parts.path == "/sso/callback/", callback_url
    return client.get(f"{parts.path}?{parts.query}")


def sign_in(client, next_url: str = ""):
    """One whole sign-in; the callback's response (a redirect to the admin, or back to its login)."""
    return callback(client, provider_answer(to_provider(client, next_url)))


def page_messages(client) -> str:
    """The admin login page's text after a redirect to it (where refusals are shown)."""
    return client.get("/admin/login/").content.decode()
