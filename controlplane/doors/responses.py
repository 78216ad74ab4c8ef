"""What a locked-out client is told (AXES_LOCKOUT_CALLABLE): the admin's page or DRF's error shape, 429."""

from __future__ import annotations

import math

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from . import lockout

CODE = "login_locked_out"


def message(seconds: int) -> str:
    minutes = max(math.ceil(seconds / 60), 1)
    span = f"{minutes} minute{'s' if minutes != 1 else ''}"
    return (f"Too many failed sign-ins for this account or from this address. Sign-in is locked for {span}; "
            "an operator can unlock it sooner.")


def lockout_response(request: HttpRequest, original_response=None, credentials=None) -> HttpResponse:
    # axes' async middleware passes (request, credentials): take the credentials the handler kept.
    if not isinstance(credentials, dict):
        credentials = getattr(request, "axes_credentials", None) or {}
    until = lockout.locked_until(request, credentials)
    seconds = max(int((until - timezone.now()).total_seconds()) + 1, 1) if until else \
        int(lockout.conf.cooloff_base().total_seconds())
    text = message(seconds)
    if request.path.startswith("/api/") or "text/html" not in request.headers.get("Accept", "text/html"):
        response = JsonResponse({"detail": text, "code": CODE}, status=429)
    else:
        context = {"title": "Sign-in locked", "lockout_message": text, "site_header": "Django administration"}
        response = render(request, "doors/locked_out.html", context, status=429)
    response["Retry-After"] = str(seconds)
    return response
