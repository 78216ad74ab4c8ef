"""Where the identity provider is and how to talk to it, from the TESSERA_OIDC_* settings.

Endpoints are read from `<issuer>/.well-known/openid-configuration` on first use and kept for
DISCOVERY_TTL_SECONDS, not at start-up: a control plane whose provider is down still starts and
keeps serving the gateway, and only SSO sign-in says the provider cannot be reached. Any endpoint
set explicitly (TESSERA_OIDC_*_ENDPOINT) wins over the discovered one; with all four set, nothing
is fetched.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import requests
from django.conf import settings
from mozilla_django_oidc.utils import import_from_settings

from tenants.roles import ROLES

DISCOVERY_TTL_SECONDS = 3600.0
_ENDPOINTS = ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
_SETTING_FOR = {
    "authorization_endpoint": "TESSERA_OIDC_AUTHORIZATION_ENDPOINT",
    "token_endpoint": "TESSERA_OIDC_TOKEN_ENDPOINT",
    "userinfo_endpoint": "TESSERA_OIDC_USERINFO_ENDPOINT",
    "jwks_uri": "TESSERA_OIDC_JWKS_ENDPOINT",
}


class ProviderUnavailable(Exception):
    """The discovery document could not be read or does not describe the configured issuer."""


@dataclass(frozen=True, slots=True)
class Provider:
    issuer: str  # the `iss` every ID token must carry
    authorization_endpoint: str  # where the browser is sent to sign in
    token_endpoint: str  # where the code is exchanged (server to server, client authenticated)
    userinfo_endpoint: str  # claims beyond the ID token; empty: the ID token's claims only
    jwks_uri: str  # the provider's public keys; ID tokens are RS256-verified against them


def sso_enabled() -> bool:
    return bool(_setting("TESSERA_OIDC_ISSUER") and _setting("TESSERA_OIDC_CLIENT_ID"))


def password_login_enabled() -> bool:
    return bool(getattr(settings, "TESSERA_ADMIN_PASSWORD_LOGIN", True))


def settings_errors() -> list[str]:
    """What is wrong with the SSO settings, in words (a system check and production.py report these)."""
    errors = []
    role_map = _setting("TESSERA_OIDC_ROLE_MAP") or {}
    if not isinstance(role_map, dict):
        errors.append("TESSERA_OIDC_ROLE_MAP must be a JSON object of provider group -> role.")
    else:
        for group, role in role_map.items():
            if role not in ROLES:
                errors.append(f"TESSERA_OIDC_ROLE_MAP maps {group!r} to {role!r}; roles are {', '.join(ROLES)}.")
    if sso_enabled() and not _setting("TESSERA_OIDC_CLIENT_SECRET"):
        errors.append("TESSERA_OIDC_CLIENT_SECRET is empty: the token endpoint authenticates the client with it.")
    if not password_login_enabled() and not sso_enabled():
        errors.append("TESSERA_ADMIN_PASSWORD_LOGIN is off and SSO is not configured: nobody could sign in.")
    return errors


_cache_lock = threading.Lock()
_discovered: dict[str, tuple[float, dict]] = {}


def provider() -> Provider:
    """The provider's endpoints (explicit settings, else discovery). Raises ProviderUnavailable."""
    issuer = _setting("TESSERA_OIDC_ISSUER").rstrip("/")
    explicit = {name: _setting(setting) for name, setting in _SETTING_FOR.items()}
    if not all(explicit[name] for name in ("authorization_endpoint", "token_endpoint", "jwks_uri")):
        document = _discovery_document(issuer)
        for name in _ENDPOINTS:
            explicit[name] = explicit[name] or document.get(name, "")
    missing = [name for name in ("authorization_endpoint", "token_endpoint", "jwks_uri") if not explicit[name]]
    if missing:
        raise ProviderUnavailable(f"the provider publishes no {', '.join(missing)}")
    return Provider(issuer=issuer, **explicit)


def forget_discovery() -> None:
    """Drop cached discovery documents (tests; a provider that moved its endpoints)."""
    with _cache_lock:
        _discovered.clear()


def _discovery_document(issuer: str) -> dict:
    now = time.monotonic()
    with _cache_lock:
        cached = _discovered.get(issuer)
        if cached and now - cached[0] < DISCOVERY_TTL_SECONDS:
            return cached[1]
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=_setting("TESSERA_OIDC_TIMEOUT_SECONDS") or 10)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"cannot read {url}: {exc.__class__.__name__}") from exc
    # OpenID Connect Discovery 4.3: the document must name exactly the issuer it was fetched for,
    # or tokens from another issuer on the same host would be taken as this one's.
    if not isinstance(document, dict) or document.get("issuer", "").rstrip("/") != issuer:
        raise ProviderUnavailable(f"{url} names issuer {document.get('issuer') if isinstance(document, dict) else None!r}")
    with _cache_lock:
        _discovered[issuer] = (now, document)
    return document


def library_setting(attr: str, *default):
    """mozilla-django-oidc's settings, derived from TESSERA_OIDC_*; anything else from Django's settings."""
    derived = {
        "OIDC_RP_SCOPES": _setting("TESSERA_OIDC_SCOPES") or "openid email profile",
        "OIDC_RP_SIGN_ALGO": "RS256",
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": bool(_setting("TESSERA_OIDC_USE_PKCE", True)),
        "OIDC_TOKEN_USE_BASIC_AUTH": _setting("TESSERA_OIDC_TOKEN_AUTH") != "client_secret_post",
        "OIDC_TIMEOUT": _setting("TESSERA_OIDC_TIMEOUT_SECONDS") or 10,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "sso-callback",
        "OIDC_CREATE_USER": True,
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_STORE_ID_TOKEN": False,
    }
    if attr in derived:
        return derived[attr]
    return import_from_settings(attr, *default)


def _setting(name: str, default=""):
    value = getattr(settings, name, default)
    if value is None:
        return default
    return value

