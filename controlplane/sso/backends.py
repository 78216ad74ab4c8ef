"""Authentication backends: local passwords (switchable off) and OpenID Connect sign-in."""

from __future__ import annotations

import logging

import jwt
import requests
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from controlplane.sso import services
from controlplane.sso.config import (
    ProviderUnavailable,
    library_setting,
    password_login_enabled,
    provider,
    sso_enabled,
)

log = logging.getLogger("tessera.sso")


def report(request, text: str) -> None:
    """Tell the person on the sign-in page why SSO did not sign them in."""
    messages.error(request, text)
    request.sso_failure_reported = True


class PasswordBackend(ModelBackend):
    """Django's username and password check, refused everywhere when TESSERA_ADMIN_PASSWORD_LOGIN is off.

    Everywhere: the admin form, and the management API's HTTP Basic authentication, which asks
    the same backends.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not password_login_enabled():
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class OIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's code flow, with the checks and the user matching this platform needs.

    Added to the library: the ID token's `iss` and `aud` (and `azp`) are checked (the library checks
    neither), the userinfo `sub` must be the ID token's, and people are matched on (issuer, sub)
    rather than email (services.sso_sign_in).
    """

    get_settings = staticmethod(library_setting)

    def __init__(self, *args, **kwargs):
        # Django builds every backend for every authenticate() and every session lookup: nothing here
        # may read the provider (a password sign-in must not wait on, or fail with, the provider).
        self.UserModel = get_user_model()
        self.OIDC_RP_SIGN_ALGO = "RS256"
        self.OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request, **kwargs):
        # Only the callback view passes `nonce`; a password form POSTed with ?code=&state= is not ours.
        if request is None or "nonce" not in kwargs or not sso_enabled():
            return None
        try:
            self.provider = provider()
        except ProviderUnavailable as exc:
            log.warning("sso provider unavailable", extra={"reason": str(exc)})
            report(request, "The identity provider cannot be reached; try again later.")
            return None
        self.OIDC_OP_TOKEN_ENDPOINT = self.provider.token_endpoint
        self.OIDC_OP_USER_ENDPOINT = self.provider.userinfo_endpoint
        self.OIDC_OP_JWKS_ENDPOINT = self.provider.jwks_uri
        self.OIDC_RP_CLIENT_ID = library_setting("TESSERA_OIDC_CLIENT_ID")
        self.OIDC_RP_CLIENT_SECRET = library_setting("TESSERA_OIDC_CLIENT_SECRET")
        try:
            return super().authenticate(request, **kwargs)
        except (SuspiciousOperation, jwt.PyJWTError) as exc:
            log.warning("sso token refused", extra={"reason": str(exc)})
            report(request, "Single sign-on failed: the identity provider's answer did not verify.")
            return None
        except requests.RequestException as exc:
            log.warning("sso token exchange failed", extra={"reason": exc.__class__.__name__})
            report(request, "Single sign-on failed: the identity provider refused or did not answer.")
            return None

    def verify_token(self, token, **kwargs):
        payload = super().verify_token(token, **kwargs)  # signature against the JWKS, alg, exp, nonce
        if "nonce" in kwargs:  # the ID token (a signed userinfo answer is checked by the library alone)
            _check_id_token_claims(payload, issuer=self.provider.issuer, client_id=self.OIDC_RP_CLIENT_ID)
        return payload

    def get_userinfo(self, access_token, id_token, payload):
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT:
            userinfo = super().get_userinfo(access_token, id_token, payload)
            # OpenID Connect Core 5.3.2: a userinfo answer for another subject must not be used.
            if userinfo.get("sub") != payload.get("sub"):
                raise SuspiciousOperation("userinfo sub differs from the ID token's")
            claims.update(userinfo)
        claims["iss"], claims["sub"] = payload["iss"], payload["sub"]
        return claims

    def get_or_create_user(self, access_token, id_token, payload):
        try:
            claims = self.get_userinfo(access_token, id_token, payload)
        except SuspiciousOperation as exc:
            log.warning("sso userinfo refused", extra={"reason": str(exc)})
            report(self.request, "Single sign-on failed: the identity provider's answer did not verify.")
            return None
        try:
            user = services.sso_sign_in(issuer=self.provider.issuer, claims=claims)
        except services.SignInRefused as refusal:
            log.info("sso sign-in refused", extra={"issuer": self.provider.issuer, "reason": str(refusal)})
            report(self.request, str(refusal))
            return None
        user.sso_amr = claims.get("amr") or []  # read by the callback view (two-factor from the provider)
        return user

    def get_user(self, user_id):
        return ModelBackend.get_user(self, user_id)  # refuses deactivated users; the library's does not


def _check_id_token_claims(payload: dict, *, issuer: str, client_id: str) -> None:
    if str(payload.get("iss", "")).rstrip("/") != issuer:
        raise SuspiciousOperation("ID token issuer is not the configured issuer")
    audience = payload.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if client_id not in audiences:
        raise SuspiciousOperation("ID token is not addressed to this client")
    if len(audiences) > 1 and payload.get("azp") != client_id:
        raise SuspiciousOperation("ID token has several audiences and another authorized party")
    if "exp" not in payload or not payload.get("sub"):
        raise SuspiciousOperation("ID token lacks exp or sub")
