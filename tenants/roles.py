"""Roles for people: the one place that says what `operator` and `finance` may do.

A role is a Django group holding a set of model permissions, kept in place after every migrate.
A user *holds* a role when they hold every permission of its set (through the group, directly, or
as a superuser). The management API (`tenants.api.permissions`) and the Django admin both ask
Django's permission system, so they agree by construction: finance holds only view permissions,
so the admin shows billing read-only and the API lets it read exports and usage, nothing else.
A staff user with neither role may log in to the admin and sees nothing; the API refuses it.

Tenants are not people: a tenant acts through an API key with `can_manage` (tenants.api).
"""

from __future__ import annotations

from django.apps import apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Group, Permission
from django.db import transaction
from django.db.models import Q

OPERATOR = "operator"
FINANCE = "finance"
ROLES = (OPERATOR, FINANCE)

# Operators: every permission of the platform's apps (add, change, delete, view of each model).
# The audit log's model has only a view permission (controlplane/audit/models.py), so operators
# may read it and nobody may change or delete it.
# axes: operators see sign-in failures and unlock by deleting access attempts (controlplane/doors).
OPERATOR_APPS = ("tenants", "billing", "deployments", "slo", "audit", "axes", "batches")
# Finance: view-only. The admin shows these read-only; nothing here can add, change or delete.
FINANCE_PERMISSIONS = (
    ("billing", "view_price"),
    ("billing", "view_usagerecord"),
    ("billing", "view_usagedaily"),
    ("billing", "view_invoice"),
    ("billing", "view_invoiceline"),
    ("billing", "view_stripecustomer"),
    ("billing", "view_stripeevent"),
    ("billing", "view_workerclassrate"),  # unit economics: the rate book and what it costed
    ("billing", "view_replicaspan"),
    ("billing", "view_replicahourcost"),
    ("billing", "view_requestcost"),
    ("tenants", "view_tenant"),  # tenant names in lists, filters and exports
    ("audit", "view_auditevent"),  # who changed prices, invoices and limits; the audit export
)


def role_permissions(role: str, *, using: str = "default"):
    """The role's permissions as a queryset of `Permission`."""
    perms = Permission.objects.using(using)
    if role == OPERATOR:
        return perms.filter(content_type__app_label__in=OPERATOR_APPS)
    if role == FINANCE:
        wanted = Q(pk__in=[])
        for app_label, codename in FINANCE_PERMISSIONS:
            wanted |= Q(content_type__app_label=app_label, codename=codename)
        return perms.filter(wanted)
    raise ValueError(f"role must be one of {ROLES}, not {role!r}")


def role_permission_names(role: str) -> set[str]:
    """`app_label.codename` strings, as `User.has_perms` takes them."""
    if role == FINANCE:
        return {f"{app}.{codename}" for app, codename in FINANCE_PERMISSIONS}
    rows = role_permissions(role).values_list("content_type__app_label", "codename")
    return {f"{app}.{codename}" for app, codename in rows}


def user_has_role(user, role: str) -> bool:
    """True for a Django user holding every permission of `role` (superusers hold every role)."""
    if not (user and getattr(user, "is_authenticated", False) and getattr(user, "is_active", False)):
        return False
    if getattr(user, "is_superuser", False):
        return True
    has_perms = getattr(user, "has_perms", None)
    names = role_permission_names(role)
    return bool(has_perms and names and has_perms(names))


def roles_ensure(*, using: str = "default") -> dict[str, Group]:
    """Create the role groups with exactly their permissions (idempotent; runs after migrate)."""
    # post_migrate runs app by app: make sure every role app's permissions exist before granting them.
    for label in {*OPERATOR_APPS, *(app for app, _ in FINANCE_PERMISSIONS)}:
        create_permissions(apps.get_app_config(label), verbosity=0, using=using)
    groups = {}
    with transaction.atomic(using=using):
        for role in ROLES:
            group, _ = Group.objects.using(using).get_or_create(name=role)
            group.permissions.set(role_permissions(role, using=using))
            groups[role] = group
    return groups


def role_grant(*, user, role: str, revoke: bool = False) -> None:
    """Put a user in (or take them out of) a role's group; granting also makes them staff (admin login)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    group = roles_ensure()[role]
    with transaction.atomic():
        if revoke:
            user.groups.remove(group)
            return
        user.groups.add(group)
        if not user.is_staff:
            user.is_staff = True
            user.save(update_fields=["is_staff"])
