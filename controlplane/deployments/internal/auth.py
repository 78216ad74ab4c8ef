from __future__ import annotations

import hmac

from rest_framework import authentication, exceptions
from rest_framework.permissions import BasePermission

from .. import conf

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


class WorkerCaller:
    """`request.user` for a caller presenting the internal token."""

    is_authenticated = True
    is_staff = False
    pk = "worker"


class WorkerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        if request.META.get("HTTP_X_FORWARDED_FOR") and conf.get_str("TESSERA_INTERNAL_ALLOW_FORWARDED") != "1":
            # Workers call the control plane's Service directly; a request that came through a proxy
            # (the public ingress adds X-Forwarded-For) is not a worker's, whatever token it carries.
            raise exceptions.PermissionDenied("The internal API is not served through the public ingress.")
        token = conf.get_str("TESSERA_INTERNAL_TOKEN")
        if not token:
            if request.META.get("REMOTE_ADDR") in LOOPBACK:
                return WorkerCaller(), None
            raise exceptions.AuthenticationFailed("Set TESSERA_INTERNAL_TOKEN: without it only loopback workers "
                                                  "may call the internal API.")
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(secret.strip().encode(), token.encode()):
            raise exceptions.AuthenticationFailed("Missing or invalid worker token.")
        return WorkerCaller(), None

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="tessera-workers"'


class IsWorker(BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, WorkerCaller)
