"""The finance role lives with the other roles in tenants/roles.py; these names stay for callers."""

from __future__ import annotations

from django.contrib.auth.models import Group

from tenants.roles import FINANCE as FINANCE_GROUP
from tenants.roles import FINANCE_PERMISSIONS as FINANCE_VIEW_PERMISSIONS
from tenants.roles import roles_ensure

__all__ = ["FINANCE_GROUP", "FINANCE_VIEW_PERMISSIONS", "finance_group_ensure"]


def finance_group_ensure(*, using: str = "default") -> Group:
    """The finance group with exactly its view permissions (idempotent; see tenants.roles)."""
    return roles_ensure(using=using)[FINANCE_GROUP]
