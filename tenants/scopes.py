"""A managing key grants at most what it holds, and changes only keys it could have created.

When a tenant's `can_manage` key creates, re-scopes or rotates a key (its own included), the result
must be within the acting key's own scopes: model and adapter allow-lists are subsets of its own (an
empty list means "any", so only an unrestricted key may grant one), and when the acting key expires
the result expires too, no later. A managing key may grant `can_manage` (it holds it), always within
these bounds. Operators (granted_by=None) are not bounded.

An update is judged by the key it leaves, not by the fields it sends: checking only the sent fields
let a key limited to one model clear the expiry of an unrestricted key (a key that never expires
and may use anything), or revive one that had expired after a rotation. So every field the change
leaves as it was counts too, and no key can un-expire or extend a key it could not have created. A
rename alone changes no access and is always allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from common.errors import ApplicationError

from .auth import KeyPrincipal

# The fields that say what a key may do, in the order a refusal reports them.
ACCESS_FIELDS = ("allowed_models", "allowed_adapters", "expires_at", "can_manage")


def _refuse(field: str, message: str, kept: bool) -> ApplicationError:
    if kept:  # the client did not send this field: say that the key it changes already reaches further
        message = f"{message} The key you change already has this {field}; a managing key may change only keys within its own scopes."
    return ApplicationError(f"{field}: {message}", code="scope_exceeds_key", status=403, param=field)


def _check_list(field: str, own: frozenset[str], wanted: Iterable[str], kept: bool) -> None:
    if not own:
        return  # the acting key may use anything, so it may grant anything
    wanted = set(wanted)
    what = field.removeprefix("allowed_")
    if not wanted:
        raise _refuse(field, f"this key is limited to {what} {sorted(own)}; it cannot grant every {what[:-1]} (an empty list).", kept)
    if outside := sorted(wanted - own):
        raise _refuse(field, f"this key is limited to {what} {sorted(own)}; it cannot grant {outside}.", kept)


def _check_field(granted_by: KeyPrincipal, field: str, value: Any, kept: bool) -> None:
    if field == "allowed_models":
        _check_list(field, granted_by.allowed_models, value, kept)
    elif field == "allowed_adapters":
        _check_list(field, granted_by.allowed_adapters, value, kept)
    elif field == "expires_at" and granted_by.expires_at is not None:
        own = datetime.fromtimestamp(granted_by.expires_at, tz=UTC)
        if value is None:
            raise _refuse(field, f"this key expires at {own.isoformat()}; it cannot grant a key that never expires.", kept)
        if value > own:
            raise _refuse(field, f"this key expires at {own.isoformat()}; it cannot grant a later expiry ({value.isoformat()}).", kept)
    elif field == "can_manage" and value and not granted_by.can_manage:  # unreachable through the API; kept for other callers
        raise _refuse(field, "this key lacks can_manage; it cannot grant it.", kept)


def key_grant_check(*, granted_by: KeyPrincipal | None, **fields) -> None:
    """Raise 403 `scope_exceeds_key` (naming the field) if a new key with `fields` would reach beyond
    `granted_by`'s scopes. Every access field of the new key must be given (an omitted one is not checked)."""
    if granted_by is None:
        return
    for field in ACCESS_FIELDS:
        if field in fields:
            _check_field(granted_by, field, fields[field], kept=False)


def key_change_check(*, granted_by: KeyPrincipal | None, current: Mapping[str, Any], changes: Mapping[str, Any]) -> None:
    """Raise 403 `scope_exceeds_key` unless the key that `changes` leave (`current` overlaid with
    them) is one `granted_by` could have created. The fields sent are checked first, so the refusal
    names what the client asked for when that is the problem."""
    if granted_by is None or not set(changes) & set(ACCESS_FIELDS):
        return  # an operator; or a rename, which grants nothing
    for field in sorted(ACCESS_FIELDS, key=lambda f: f not in changes):
        kept = field not in changes
        _check_field(granted_by, field, current[field] if kept else changes[field], kept)
