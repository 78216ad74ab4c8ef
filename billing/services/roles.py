from __future__ import annotations

from django.contrib.auth.models import Group, Permission
from django.db import transaction

FINANCE_GROUP = "finance"
# View-only: Django admin shows these read-only; nothing here can add, change or delete.
FINANCE_VIEW_PERMISSIONS = [
    ("billing", "view_price"),
    ("billing", "view_usagerecord"),
    ("billing", "view_usagedaily"),
    ("billing", "view_invoice"),
    ("billing", "view_invoiceline"),
    ("billing", "view_stripecustomer"),
    ("billing", "view_stripeevent"),
    ("tenants", "view_tenant"),  # tenant names in lists and filters
]


def finance_group_ensure(*, using: str = "default") -> Group:
    """Create the finance group with exactly the view permissions above (idempotent; runs after migrate)."""
    with transaction.atomic(using=using):
        group, _ = Group.objects.using(using).get_or_create(name=FINANCE_GROUP)
        wanted = Permission.objects.using(using).none()
        for app_label, codename in FINANCE_VIEW_PERMISSIONS:
            wanted |= Permission.objects.using(using).filter(content_type__app_label=app_label, codename=codename)
        group.permissions.set(wanted)
    return group
