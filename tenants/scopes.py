"""A managing key grants at most what it holds.

When a tenant's `can_manage` key creates, re-scopes or rotates a key (its own included), the result
must be within the acting key's own scopes: model and adapter allow-lists are subsets of its own (an
empty list means "any", so only an unrestricted key may grant one), and when the acting key expires
the result expires too, no later. A managing key may grant `can_manage` (it holds it), always within
these bounds. Operators (granted_by=None) are not bounded.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from controlplane.errors import ApplicationError

from .auth import KeyPrincipal


def _refuse(field: str, message: str) -> ApplicationError:
    return ApplicationError(f"{field}: {message}", code="scope_exceeds_key", status=403, param=field)


def _check_list(field: str, own: frozenset[str], wanted: Iterable[str]) -> None:
    if not own:
        return  # the acting key may use anything, so it may grant anything
    wanted = set(wanted)
    what = field.removeprefix("allowed_")
    if not wanted:
        raise _refuse(field, f"this key is limited to {what} {sorted(own)}; it cannot grant every {what[:-1]} (an empty list).")
    if outside := sorted(wanted - own):
        raise _refuse(field, f"this key is limited to {what} {sorted(own)}; it cannot grant {outside}.")


def key_grant_check(*, granted_by: KeyPrincipal | None, **fields) -> None:
    """Raise 403 `scope_exceeds_key` (naming the field) if `fields` would reach beyond `granted_by`'s scopes.

    Only the fields given are checked, so renaming a wider key is allowed; re-scoping it is bounded.
    """
    if granted_by is None:
        return
    if "allowed_models" in fields:
        _check_list("allowed_models", granted_by.allowed_models, fields["allowed_models"])
    if "allowed_adapters" in fields:
        _check_list("allowed_adapters", granted_by.allowed_adapters, fields["allowed_adapters"])
    if "expires_at" in fields and granted_by.expires_at is not None:
        own = datetime.fromtimestamp(granted_by.expires_at, tz=UTC)
        wanted: datetime | None = fields["expires_at"]
        if wanted is None:
            raise _refuse("expires_at", f"this key expires at {own.isoformat()}; it cannot grant a key that never expires.")
        if wanted > own:
            raise _refuse("expires_at", f"this key expires at {own.isoformat()}; it cannot grant a later expiry ({wanted.isoformat()}).")
    if fields.get("can_manage") and not granted_by.can_manage:  # unreachable through the API; kept for other callers
        raise _refuse("can_manage", "this key lacks can_manage; it cannot grant it.")
