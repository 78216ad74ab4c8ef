"""Shared JSON output of the operator commands."""

from __future__ import annotations

import json

from django.core.management.base import CommandError

from common.errors import ApplicationError
from tenants.models import APIKey, Tenant


def tenant_json(tenant: Tenant) -> dict:
    return {"id": tenant.pk, "slug": tenant.slug, "name": tenant.name, "status": tenant.status, "tier": tenant.tier.name}


def key_json(key: APIKey) -> dict:
    return {
        "id": key.pk,
        "tenant": key.tenant.slug,
        "name": key.name,
        "prefix": key.prefix,
        "allowed_models": key.allowed_models,
        "allowed_adapters": key.allowed_adapters,
        "can_manage": key.can_manage,
        "expires_at": key.expires_at.isoformat() if key.expires_at else None,
        "revoked": key.revoked,
    }


def dump(command, payload: dict) -> None:
    command.stdout.write(json.dumps(payload, indent=2))


def fail(exc: ApplicationError) -> CommandError:
    return CommandError(f"{exc.code}: {exc.message}")
