"""Refuses password sign-in to the admin when TESSERA_ADMIN_PASSWORD_LOGIN is off."""

from __future__ import annotations

from django.http import HttpResponseForbidden
from django.urls import reverse
from django.utils.deprecation import MiddlewareMixin

from controlplane.sso.config import password_login_enabled

REFUSAL = "Password sign-in is turned off on this platform; use \"Sign in with SSO\" on the admin sign-in page.\n"


class PasswordLoginGate(MiddlewareMixin):
    """A POST to the admin's login view is a password attempt: refused before the form reads it.

    The password backend refuses too (backends.PasswordBackend), which covers every other door that
    asks Django's backends; this answer exists so the person is told why. Sync and async
    (MiddlewareMixin): one sync-only middleware makes Django run every async view of the stack in
    one thread, one request at a time.
    """

    def process_request(self, request):
        if request.method == "POST" and not password_login_enabled() and request.path == reverse("admin:login"):
            return HttpResponseForbidden(REFUSAL, content_type="text/plain; charset=utf-8")
        return None
