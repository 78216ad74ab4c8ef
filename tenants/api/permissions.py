from __future__ import annotations

from rest_framework.permissions import BasePermission

from .authentication import TenantUser


class IsOperator(BasePermission):
    """A Django staff user (session or basic auth). Tenant keys are never operators."""

    message = "Only operators may do this."

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and not isinstance(user, TenantUser) and user.is_staff)


class IsTenantKey(BasePermission):
    """A tenant's own API key with can_manage (checked at authentication)."""

    message = "Authenticate with one of your tenant's API keys that has can_manage."

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, TenantUser)
