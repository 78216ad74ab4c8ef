"""Operator commands print JSON and go through the same services."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tenants import auth
from tenants.models import APIKey, Tenant

pytestmark = pytest.mark.django_db


def run(*args) -> dict:
    out = StringIO()
    call_command(*args, stdout=out)
    return json.loads(out.getvalue())


def test_tenant_create_prints_the_tenant_and_a_working_key():
    result = run("tenant_create", "--name", "Acme Corp", "--tier", "standard")
    assert result["tenant"]["slug"] == "acme-corp" and result["tenant"]["tier"] == "standard"
    principal = auth.authenticate(result["api_key"])
    assert principal.tenant_slug == "acme-corp" and principal.can_manage


def test_tenant_create_refuses_unknown_tier_and_duplicates():
    with pytest.raises(CommandError, match="not_found"):
        run("tenant_create", "--name", "X", "--tier", "platinum")
    run("tenant_create", "--name", "Dup", "--tier", "free")
    with pytest.raises(CommandError, match="tenant_exists"):
        run("tenant_create", "--name", "Dup", "--tier", "free")


def test_key_create_revoke_and_tenant_suspend():
    run("tenant_create", "--name", "Initech", "--tier", "free")
    created = run("key_create", "--tenant", "initech", "--name", "batch", "--models", "m1,m2", "--expires-in-days", "7")
    assert created["key"]["allowed_models"] == ["m1", "m2"] and created["key"]["expires_at"]
    assert auth.authenticate(created["api_key"]).key_name == "batch"

    revoked = run("key_revoke", "--prefix", created["key"]["prefix"])
    assert revoked["key"]["revoked"] is True and APIKey.objects.get(pk=created["key"]["id"]).revoked

    assert run("tenant_suspend", "--tenant", "initech")["tenant"]["status"] == "suspended"
    assert Tenant.objects.get(slug="initech").status == "suspended"
    assert run("tenant_suspend", "--tenant", "initech", "--activate")["tenant"]["status"] == "active"
    with pytest.raises(CommandError):
        run("key_revoke", "--id", "999999")
