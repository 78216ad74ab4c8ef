"""One DRF permission class per role; every /api/v1 view uses these (tenants/roles.py defines the roles).

A Django user with neither role (plain `is_staff` included) may do nothing on /api/v1.
"""

from __future__ import annotations

from rest_framework.permissions import BasePermission

from tenants.roles import FINANCE, OPERATOR, user_has_role

from .authentication import TenantUser


def _person(request):
    user = request.user
    return None if user is None or isinstance(user, TenantUser) else user


class IsOperator(BasePermission):
    """A Django user holding the operator role (the `operator` group, or a superuser). Never a key."""

    message = "Only operators may do this (the operator role: manage.py role_grant --role operator)."

    def has_permission(self, request, view) -> bool:
        return user_has_role(_person(request), OPERATOR)


class IsFinance(BasePermission):
    """A Django user holding the finance role (the `finance` group; operators and superusers hold it too)."""

    message = "Only finance or operators may read this (the finance role: manage.py role_grant --role finance)."

    def has_permission(self, request, view) -> bool:
        return user_has_role(_person(request), FINANCE)


class IsTenantKey(BasePermission):
    """A tenant's own API key with can_manage (checked at authentication)."""

    message = "Authenticate with one of your tenant's API keys that has can_manage."

    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, TenantUser)
