"""The management API's session and basic authentication, holding to the same second-factor rule as the admin.

A session that has not passed its second factor is anonymous to the API. Basic authentication
(a password and nothing else) is refused for a user who must use a second factor: such a user
reaches the API through the admin's session, or through a tenant API key.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework import authentication, exceptions

from controlplane.sso.config import password_login_enabled

from . import basic_cache, lockout, twofactor


class VerifiedSessionAuthentication(authentication.SessionAuthentication):
    def authenticate(self, request):
        result = super().authenticate(request)
        if result is not None and not twofactor.second_factor_ok(request._request):
            return None
        return result


class PasswordOnlyBasicAuthentication(authentication.BasicAuthentication):
    def authenticate_credentials(self, userid, password, request=None):
        user = self._recalled(userid, password, request)
        if user is not None:
            return self._signed_in(user, request), None
        try:
            user, auth = super().authenticate_credentials(userid, password, request)
        except exceptions.AuthenticationFailed:
            # axes flags DRF's Request, not the HttpRequest its middleware sees: pass the flag on, so
            # a locked-out caller gets the lockout's 429 (with Retry-After) instead of a plain 401.
            inner = getattr(request, "_request", None)
            if inner is not None and getattr(request, "axes_locked_out", False):
                inner.axes_locked_out = True
                inner.axes_credentials = getattr(request, "axes_credentials", None)
            raise
        user = self._signed_in(user, request)
        basic_cache.remember(userid, password, user_pk=user.pk, stored_hash=user.password)
        return user, auth

    @staticmethod
    def _recalled(userid, password, request):
        """The user of a pair verified within the last minute (basic_cache.py), if it still holds:
        same stored hash, active, password sign-in on, not locked out. Else None: the full check runs."""
        found = basic_cache.recall(userid, password)
        if found is None or not password_login_enabled():
            return None
        user = get_user_model()._default_manager.filter(pk=found.user_pk, is_active=True).first()
        if user is None or user.password != found.stored_hash:
            return None
        if lockout.locked_until(getattr(request, "_request", request), {"username": userid}) is not None:
            return None  # the full path answers with the lockout's 429 and its Retry-After
        return user

    @staticmethod
    def _signed_in(user, request):
        if twofactor.requires_second_factor(user):
            raise exceptions.AuthenticationFailed(
                "This account signs in with a second factor: use the admin's session or an API key, not a password.")
        # Known at this address from now on: an address lock others cause does not shut it out (lockout.py).
        lockout.remember_sign_in(getattr(request, "_request", request), user.get_username())
        return user


# The OpenAPI schema describes them as the standard cookie and basic schemes they narrow.
from drf_spectacular.authentication import BasicScheme, SessionScheme  # noqa: E402


class VerifiedSessionScheme(SessionScheme):
    target_class = VerifiedSessionAuthentication


class PasswordOnlyBasicScheme(BasicScheme):
    target_class = PasswordOnlyBasicAuthentication
