"""Reads of the audit log. A tenant's reads always name the tenant (STYLE.md: selectors take the tenant)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from .models import AuditEvent


def audit_events(
    *,
    tenant_id: int | None,
    all_tenants: bool = False,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """Newest first. `tenant_id=None` reads every tenant's events (and the platform's) only with
    `all_tenants=True`, so a caller that forgot the tenant reads nothing rather than everything."""
    events = AuditEvent.objects.all()
    if tenant_id is not None:
        events = events.filter(tenant_id=tenant_id)
    elif not all_tenants:
        return events.none()
    if action:
        # "api_key" matches every api_key.* action; "api_key.revoke" only itself.
        events = events.filter(action=action) if "." in action else events.filter(action__startswith=f"{action}.")
    if since is not None:
        events = events.filter(at__gte=since)
    if until is not None:
        events = events.filter(at__lt=until)
    return events.order_by("-at", "-id")
