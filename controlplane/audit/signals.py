"""People's access has no service of its own: Django's admin, createsuperuser, changepassword and
`role_grant` all change users and groups directly, so users and groups are recorded by signals.

A user's password is recorded as changed, never its hash. Group membership in a role's group
(tenants/roles.py) is recorded as `role.grant` / `role.revoke`.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from tenants.roles import ROLES

from .writer import diff, record

USER_FIELDS = ("username", "email", "is_active", "is_staff", "is_superuser", "password")


def _user_state(user) -> dict:
    return {field: getattr(user, field, None) for field in USER_FIELDS}


def _user_before(sender, instance, update_fields=None, raw=False, **kwargs) -> None:
    if raw or instance.pk is None:
        return
    if update_fields is not None and not set(update_fields) & set(USER_FIELDS):
        instance._audit_before = None  # a login's last_login, nothing that matters
        return
    row = sender._base_manager.filter(pk=instance.pk).values(*USER_FIELDS).first()
    instance._audit_before = row


def _user_saved(sender, instance, created, raw=False, update_fields=None, **kwargs) -> None:
    if raw:
        return
    if created:
        record("user.create", instance, changes=diff(None, _user_state(instance)))
        return
    before = getattr(instance, "_audit_before", None)
    instance._audit_before = None
    if before is None:
        return
    changes = diff(before, _user_state(instance))
    if changes:
        record("user.update", instance, changes=changes)


def _user_deleted(sender, instance, **kwargs) -> None:
    record("user.delete", instance, changes=diff(_user_state(instance), None), object_id=instance.pk)


def _group_saved(sender, instance, created, raw=False, **kwargs) -> None:
    if created and not raw:
        record("group.create", instance, changes={"name": [None, instance.name]})


def _group_deleted(sender, instance, **kwargs) -> None:
    record("group.delete", instance, changes={"name": [instance.name, None]}, object_id=instance.pk)


def _names(model, pks) -> list[str]:
    field = "name" if model is Group else "codename"
    return sorted(model.objects.filter(pk__in=pks).values_list(field, flat=True))


def _m2m_recorder(kind: str):
    """user.groups / user.user_permissions / group.permissions, from either side of the relation."""

    def handler(sender, instance, action, reverse, model, pk_set, **kwargs) -> None:
        if action == "pre_clear":
            if reverse:  # group.user_set.clear(): every member loses this group
                instance._audit_m2m_cleared_owners = list(
                    _owner_model(kind).objects.filter(**{_attr(kind): instance.pk}).values_list("pk", flat=True))
            else:
                instance._audit_m2m_cleared = set(getattr(instance, _attr(kind)).values_list("pk", flat=True))
            return
        if action not in ("post_add", "post_remove", "post_clear"):
            return
        if reverse and action == "post_clear":
            pk_set, action = set(getattr(instance, "_audit_m2m_cleared_owners", ())), "post_remove"
        owners = [instance] if not reverse else list(_owner_model(kind).objects.filter(pk__in=pk_set or ()))
        for owner in owners:
            current = set(getattr(owner, _attr(kind)).values_list("pk", flat=True))
            if action == "post_add":
                changed = {instance.pk} if reverse else set(pk_set or ())
                before, after = current - changed, current
            elif action == "post_remove":
                changed = {instance.pk} if reverse else set(pk_set or ())
                before, after = current | changed, current
            else:
                before, after = getattr(owner, "_audit_m2m_cleared", None) or set(), current
                changed = before - after
            if before == after:
                continue
            target = _target_model(kind)
            verb = {"post_add": "add", "post_remove": "remove", "post_clear": "clear"}[action]
            name = f"{kind}.{verb}"
            if kind == "user.groups":
                if set(_names(Group, changed)) & set(ROLES):
                    name = "role.grant" if verb == "add" else "role.revoke"
            field = kind.split(".", 1)[1]
            record(name, owner, changes={field: [_names(target, before), _names(target, after)]})

    return handler


def _attr(kind: str) -> str:
    return {"user.groups": "groups", "user.user_permissions": "user_permissions",
            "group.permissions": "permissions"}[kind]


def _owner_model(kind: str):
    return Group if kind == "group.permissions" else get_user_model()


def _target_model(kind: str):
    return Group if kind == "user.groups" else Permission


def connect() -> None:
    User = get_user_model()
    pre_save.connect(_user_before, sender=User, dispatch_uid="audit_user_before")
    post_save.connect(_user_saved, sender=User, dispatch_uid="audit_user_saved")
    post_delete.connect(_user_deleted, sender=User, dispatch_uid="audit_user_deleted")
    post_save.connect(_group_saved, sender=Group, dispatch_uid="audit_group_saved")
    post_delete.connect(_group_deleted, sender=Group, dispatch_uid="audit_group_deleted")
    for kind, through in (("user.groups", User.groups.through),
                          ("user.user_permissions", User.user_permissions.through),
                          ("group.permissions", Group.permissions.through)):
        m2m_changed.connect(_m2m_recorder(kind), sender=through, weak=False, dispatch_uid=f"audit_{kind}")
