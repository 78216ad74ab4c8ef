"""The management API's session and basic authentication, holding to the same second-factor rule as the admin.

A session that has not passed its second factor is anonymous to the API. Basic authentication
(a password and nothing else) is refused for a user who must use a second factor: such a user
reaches the API through the admin's session, or through a tenant API key.
"""

from __future__ import annotations

from rest_framework import authentication, exceptions

from . import twofactor


class VerifiedSessionAuthentication(authentication.SessionAuthentication):
    def authenticate(self, request):
        result = super().authenticate(request)
        if result is not None and not twofactor.second_factor_ok(request._request):
            return None
        return result


class PasswordOnlyBasicAuthentication(authentication.BasicAuthentication):
    def authenticate_credentials(self, userid, password, request=None):
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
        if twofactor.requires_second_factor(user):
            raise exceptions.AuthenticationFailed(
                "This account signs in with a second factor: use the admin's session or an API key, not a password.")
        return user, auth


# The OpenAPI schema describes them as the standard cookie and basic schemes they narrow.
from drf_spectacular.authentication import BasicScheme, SessionScheme  # noqa: E402


class VerifiedSessionScheme(SessionScheme):
    target_class = VerifiedSessionAuthentication


class PasswordOnlyBasicScheme(BasicScheme):
    target_class = PasswordOnlyBasicAuthentication
