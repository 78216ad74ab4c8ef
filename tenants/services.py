"""Writes: keyword-only `<entity>_<action>` functions. Views and the CLI call exactly one of these."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from common.errors import ApplicationError
from controlplane import audit

from . import auth
from .keys import generate_secret, hash_secret, visible_prefix
from .models import APIKey, Tenant, TenantStatus, Tier
from .scopes import ACCESS_FIELDS, key_change_check, key_grant_check

DEFAULT_ROTATION_GRACE = timedelta(hours=24)

TENANT_OVERRIDE_FIELDS = (
    "priority_override",
    "requests_per_minute_override",
    "tokens_per_minute_override",
    "max_concurrent_requests_override",
    "monthly_token_budget_override",
    "monthly_spend_budget_override",
    "budget_enforcement_override",
)
TIER_FIELDS = (
    "description",
    "priority",
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrent_requests",
    "monthly_token_budget",
    "monthly_spend_budget",
    "budget_enforcement",
    "slo_ttft_p95_ms",
    "slo_itl_p95_ms",
    "slo_availability_pct",
    "fair_share_weight",
)


@dataclass(frozen=True, slots=True)
class CreatedKey:
    key: APIKey
    secret: str  # the only time the full `sk-...` value exists outside the client


def _forget_cached_keys() -> None:
    transaction.on_commit(auth.cache_clear)


# --- tenants --------------------------------------------------------------------------------------


def tenant_create(*, name: str, tier: Tier, slug: str | None = None, **overrides) -> Tenant:
    unknown = set(overrides) - set(TENANT_OVERRIDE_FIELDS)
    if unknown:
        raise ApplicationError(f"Unknown tenant fields: {sorted(unknown)}", code="invalid_field")
    slug = slug or slugify(name)
    if not slug:
        raise ApplicationError("A tenant needs a name that gives a slug.", code="invalid_slug", param="slug")
    try:
        with transaction.atomic():
            tenant = Tenant.objects.create(name=name, slug=slug, tier=tier, **overrides)
            audit.record("tenant.create", tenant)
            return tenant
    except IntegrityError:
        raise ApplicationError(f"Tenant {slug!r} already exists.", code="tenant_exists", status=409) from None


def tenant_create_with_key(*, name: str, tier: Tier, slug: str | None = None) -> tuple[Tenant, CreatedKey]:
    """A tenant and its first key, which may also manage the tenant's other keys."""
    with transaction.atomic():
        tenant = tenant_create(name=name, tier=tier, slug=slug)
        created = api_key_create(tenant=tenant, name="default", can_manage=True)
    return tenant, created


def tenant_update(*, tenant: Tenant, **fields) -> Tenant:
    allowed = {"name", "tier"} | set(TENANT_OVERRIDE_FIELDS)
    unknown = set(fields) - allowed
    if unknown:
        raise ApplicationError(f"Unknown tenant fields: {sorted(unknown)}", code="invalid_field")
    with audit.change("tenant.update", tenant):
        for field, value in fields.items():
            setattr(tenant, field, value)
        tenant.save(update_fields=[*fields, "updated_at"])
    _forget_cached_keys()
    return tenant


def tenant_suspend(*, tenant: Tenant) -> Tenant:
    return _tenant_set_status(tenant=tenant, status=TenantStatus.SUSPENDED)


def tenant_activate(*, tenant: Tenant) -> Tenant:
    return _tenant_set_status(tenant=tenant, status=TenantStatus.ACTIVE)


def _tenant_set_status(*, tenant: Tenant, status: str) -> Tenant:
    action = "tenant.suspend" if status == TenantStatus.SUSPENDED else "tenant.activate"
    with audit.change(action, tenant):
        tenant.status = status
        tenant.save(update_fields=["status", "updated_at"])
    _forget_cached_keys()
    return tenant


# --- tiers ----------------------------------------------------------------------------------------


def tier_create(*, name: str, **fields) -> Tier:
    unknown = set(fields) - set(TIER_FIELDS)
    if unknown:
        raise ApplicationError(f"Unknown tier fields: {sorted(unknown)}", code="invalid_field")
    try:
        with transaction.atomic():
            tier = Tier.objects.create(name=name, **fields)
            audit.record("tier.create", tier)
            return tier
    except IntegrityError:
        raise ApplicationError(f"Tier {name!r} already exists.", code="tier_exists", status=409) from None


def tier_update(*, tier: Tier, **fields) -> Tier:
    unknown = set(fields) - set(TIER_FIELDS)
    if unknown:
        raise ApplicationError(f"Unknown tier fields: {sorted(unknown)}", code="invalid_field")
    with audit.change("tier.update", tier):
        for field, value in fields.items():
            setattr(tier, field, value)
        tier.save(update_fields=[*fields, "updated_at"])
    _forget_cached_keys()
    return tier


# --- API keys -------------------------------------------------------------------------------------


def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    allowed_models: Iterable[str] = (),
    allowed_adapters: Iterable[str] = (),
    expires_at: datetime | None = None,
    can_manage: bool = False,
    rotated_from: APIKey | None = None,
    granted_by: auth.KeyPrincipal | None = None,
) -> CreatedKey:
    """`granted_by`: the managing key that asks (None for operators); the new key stays within its scopes."""
    allowed_models, allowed_adapters = sorted(set(allowed_models)), sorted(set(allowed_adapters))
    key_grant_check(
        granted_by=granted_by, allowed_models=allowed_models, allowed_adapters=allowed_adapters,
        expires_at=expires_at, can_manage=can_manage,
    )
    if expires_at is not None and expires_at <= timezone.now():
        raise ApplicationError("expires_at must be in the future.", code="invalid_expiry", param="expires_at")
    secret = generate_secret()
    with transaction.atomic():
        key = APIKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=visible_prefix(secret),
            key_hash=hash_secret(secret),
            allowed_models=allowed_models,
            allowed_adapters=allowed_adapters,
            expires_at=expires_at,
            can_manage=can_manage,
            rotated_from=rotated_from,
        )
        audit.record("api_key.rotate" if rotated_from is not None else "api_key.create", key)
    return CreatedKey(key=key, secret=secret)


def _check_owner(tenant: Tenant, key: APIKey) -> None:
    if key.tenant_id != tenant.pk:
        # Same answer as a missing key: never confirm another tenant's key exists.
        raise ApplicationError("No such API key.", code="not_found", status=404)


def api_key_revoke(*, tenant: Tenant, key: APIKey) -> APIKey:
    _check_owner(tenant, key)
    if not key.revoked:
        with audit.change("api_key.revoke", key):
            key.revoked = True
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked", "revoked_at"])
    _forget_cached_keys()
    return key


def api_key_rotate(
    *,
    tenant: Tenant,
    key: APIKey,
    grace: timedelta = DEFAULT_ROTATION_GRACE,
    granted_by: auth.KeyPrincipal | None = None,
) -> CreatedKey:
    """A new key with the same scopes; the old one keeps working for `grace`, then expires.
    A managing key may rotate only keys within its own scopes (the new key copies them)."""
    _check_owner(tenant, key)
    now = timezone.now()
    if not key.is_usable(now):
        raise ApplicationError("A revoked or expired key cannot be rotated.", code="key_not_usable", status=409)
    if grace < timedelta(0):
        raise ApplicationError("grace must not be negative.", code="invalid_grace", param="grace_seconds")
    with transaction.atomic():
        created = api_key_create(
            tenant=tenant,
            name=key.name,
            allowed_models=key.allowed_models,
            allowed_adapters=key.allowed_adapters,
            expires_at=key.expires_at,
            can_manage=key.can_manage,
            rotated_from=key,
            granted_by=granted_by,
        )
        old_until = now + grace
        if key.expires_at is None or key.expires_at > old_until:
            with audit.change("api_key.rotate_out", key):
                key.expires_at = old_until
                key.save(update_fields=["expires_at"])
    _forget_cached_keys()
    return created


def api_key_update(*, tenant: Tenant, key: APIKey, granted_by: auth.KeyPrincipal | None = None, **fields) -> APIKey:
    """Change the given fields. `granted_by` (a managing key; None for operators) may change a key
    only if the result is one it could have created: within its own scopes and expiry, whatever the
    fields sent (its own key included). A rename alone is always allowed."""
    _check_owner(tenant, key)
    allowed = {"name", *ACCESS_FIELDS}
    unknown = set(fields) - allowed
    if unknown:
        raise ApplicationError(f"Unknown key fields: {sorted(unknown)}", code="invalid_field")
    for field in ("allowed_models", "allowed_adapters"):
        if field in fields:
            fields[field] = sorted(set(fields[field]))
    with audit.change("api_key.update", key):
        # Judge the row as it is now, locked: two changes racing must not each pass against a stale copy.
        stored = APIKey.objects.select_for_update().get(pk=key.pk)
        key_change_check(
            granted_by=granted_by, current={f: getattr(stored, f) for f in ACCESS_FIELDS}, changes=fields
        )
        for field, value in fields.items():
            setattr(stored, field, value)
        stored.save(update_fields=list(fields))
    _forget_cached_keys()
    return stored


def api_keys_touch(*, used: dict[int, datetime]) -> None:
    """Record last use for many keys at once (the gateway batches and throttles these writes)."""
    for key_id, at in used.items():
        APIKey.objects.filter(pk=key_id).update(last_used_at=at)
