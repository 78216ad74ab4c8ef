"""Writing audit events: `record` for one event, `change` around an update, `snapshot` for state.

Called by services (tenants, billing, deployments), by the admin for the saves it makes itself
(`admin_mixins.AuditedAdminMixin`) and by signals for users and groups. The event is written in
the caller's transaction: a change that rolls back leaves no record, a record that fails undoes
the change.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction

from . import context
from .models import AuditEvent
from .redact import redact_changes, scrub

# Bookkeeping that changes on its own and says nothing about who may do what.
IGNORED_FIELDS = frozenset({"created_at", "updated_at", "last_used_at", "last_login", "date_joined",
                            "last_heartbeat_at"})


def _plain(value: Any) -> Any:
    """JSON-safe: Decimals and datetimes as strings (exact), the rest as JSON keeps it."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def snapshot(obj: models.Model | None, fields: Iterable[str] | None = None) -> dict[str, Any] | None:
    """The object's stored-field values (foreign keys as ids), JSON-safe, bookkeeping left out."""
    if obj is None:
        return None
    wanted = set(fields) if fields is not None else None
    state = {}
    for field in obj._meta.concrete_fields:
        if field.primary_key or field.name in IGNORED_FIELDS:
            continue
        if wanted is not None and field.name not in wanted and field.attname not in wanted:
            continue
        state[field.name] = _plain(field.value_from_object(obj))
    return state


def stored(obj: models.Model) -> models.Model | None:
    """The row as the database holds it now (None when it is gone or was never saved)."""
    if obj.pk is None:
        return None
    return type(obj)._base_manager.filter(pk=obj.pk).first()


def diff(before: dict | None, after: dict | None) -> dict[str, list]:
    before, after = before or {}, after or {}
    return {
        field: [before.get(field), after.get(field)]
        for field in sorted(set(before) | set(after))
        if before.get(field) != after.get(field)
    }


def object_type(obj: models.Model) -> str:
    return obj._meta.label_lower


def tenant_of(obj: models.Model) -> int | None:
    if obj._meta.label_lower == "tenants.tenant":
        return obj.pk
    return getattr(obj, "tenant_id", None)


def record(
    action: str,
    obj: models.Model | None = None,
    *,
    changes: dict[str, list] | None = None,
    before: dict | None = None,
    after: dict | None = None,
    tenant_id: int | None = None,
    type_: str = "",
    object_id: Any = "",
    object_repr: str = "",
) -> AuditEvent:
    """Write one event. `changes` is {field: [before, after]}; without it, it is the diff of `before`
    and `after` (after defaults to the object's snapshot: a create records every field)."""
    if changes is None:
        if after is None and obj is not None:
            after = snapshot(stored(obj) or obj)  # as stored: Decimal places, normalised lists
        changes = diff(before, after)
    origin = context.current()
    actor = context.actor_of(origin)
    if obj is not None:
        type_ = type_ or object_type(obj)
        object_id = object_id or obj.pk
        object_repr = object_repr or str(obj)
        tenant_id = tenant_id if tenant_id is not None else tenant_of(obj)
    return AuditEvent.objects.create(
        actor_type=actor.type, actor=actor.label[:200], actor_user_id=actor.user_id,
        actor_username=actor.username[:150], actor_key_id=actor.key_id, actor_key_prefix=actor.key_prefix[:16],
        action=action[:64], object_type=type_[:64], object_id=str(object_id if object_id is not None else "")[:64],
        object_repr=scrub(object_repr)[:200], tenant_id=tenant_id, changes=redact_changes(changes),
        channel=origin.channel, via=origin.via[:300], client_address=origin.client_address,
        request_id=origin.request_id[:64],
    )


@contextmanager
def change(action: str, obj: models.Model, *, fields: Iterable[str] | None = None) -> Iterator[None]:
    """Around code that updates (or removes) `obj`: one transaction, before and after read from the
    database, so it does not matter which copy of the row the code changed, or whether it used
    `QuerySet.update()`. Nothing is recorded when nothing changed."""
    fields = list(fields) if fields is not None else None
    pk, label, tenant_id = obj.pk, str(obj), tenant_of(obj)  # a deleted instance loses its pk
    with transaction.atomic():
        before = snapshot(stored(obj), fields)
        yield
        current = type(obj)._base_manager.filter(pk=pk).first()
        changes = diff(before, snapshot(current, fields))
        if changes:
            record(action, current or obj, changes=changes, tenant_id=tenant_id, object_id=pk, object_repr=label)
