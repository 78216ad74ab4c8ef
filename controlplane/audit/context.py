"""Who is acting and from where, carried through a context variable to whatever records a change.

Set once per door: the middleware (admin and management API requests), every manage.py command
(`commands.py`) and every Celery task (`tasks_context.py`). Services never take an actor argument;
`record` reads this. The HTTP actor is resolved when a record is written, not when the request
arrives, because DRF authenticates (keys, basic auth) inside the view and only then sets the user.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .models import ActorType, Channel


@dataclass(frozen=True, slots=True)
class Origin:
    channel: str  # Channel value
    via: str = ""  # "PATCH /api/v1/tiers/free/", "manage.py key_revoke", "task audit.prune"
    client_address: str | None = None
    request_id: str = ""
    request: Any = None  # the HttpRequest whose user acts (HTTP doors only)
    system_actor: str = ""  # "system:manage.py key_revoke" (commands and tasks)


@dataclass(frozen=True, slots=True)
class Actor:
    type: str
    label: str
    user_id: int | None = None
    username: str = ""
    key_id: int | None = None
    key_prefix: str = ""
    key_tenant_id: int | None = None


_current: contextvars.ContextVar[Origin | None] = contextvars.ContextVar("tessera_audit_origin", default=None)
UNKNOWN = Origin(channel=Channel.OTHER, system_actor="system:unknown")


def new_request_id() -> str:
    return uuid.uuid4().hex


def is_set() -> bool:
    return _current.get() is not None


def current() -> Origin:
    return _current.get() or UNKNOWN


def push(origin: Origin) -> contextvars.Token:
    return _current.set(origin)


def pop(token: contextvars.Token) -> None:
    _current.reset(token)


@contextmanager
def acting(origin: Origin) -> Iterator[Origin]:
    token = push(origin)
    try:
        yield origin
    finally:
        pop(token)


@contextmanager
def system(name: str, *, channel: str = Channel.OTHER, request_id: str = "") -> Iterator[Origin]:
    """Changes made inside are attributed to "system:<name>" (scripts, data fixes, tests)."""
    with acting(Origin(channel=channel, via=name, request_id=request_id or new_request_id(),
                       system_actor=f"system:{name}")) as origin:
        yield origin


def actor_of(origin: Origin) -> Actor:
    if origin.request is None:
        return Actor(type=ActorType.SYSTEM, label=origin.system_actor or "system:unknown")
    user = getattr(origin.request, "user", None)
    principal = getattr(user, "principal", None)  # tenants.api.authentication.TenantUser
    if principal is not None:
        return Actor(type=ActorType.API_KEY, label=f"key:{principal.key_prefix} ({principal.tenant_slug})",
                     key_id=principal.key_id, key_prefix=principal.key_prefix, key_tenant_id=principal.tenant_id)
    if user is not None and getattr(user, "is_authenticated", False) and not hasattr(user, "get_username"):
        # A caller that is not a person (a data-plane worker presenting the internal token).
        return Actor(type=ActorType.SYSTEM, label=f"system:{type(user).__name__.lower()}:{user.pk}")
    if user is not None and getattr(user, "is_authenticated", False):
        username = user.get_username()
        return Actor(type=ActorType.USER, label=f"user:{username}", user_id=user.pk, username=username)
    return Actor(type=ActorType.ANONYMOUS, label="anonymous")
