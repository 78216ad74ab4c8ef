"""API keys: the keyed hash, shown-once secrets, rotation with a grace period, revocation, expiry."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

import pytest
from django.utils import timezone

from common.errors import ApplicationError
from tenants import auth, services
from tenants.keys import hash_secret
from tenants.models import APIKey

pytestmark = pytest.mark.django_db


def test_only_a_keyed_hash_and_a_short_prefix_are_stored(make_tenant, settings):
    created = services.api_key_create(tenant=make_tenant(), name="ci")
    secret = created.secret
    assert secret.startswith("sk-") and len(secret) >= 40
    row = APIKey.objects.get(pk=created.key.pk)
    expected = hmac.new(settings.TESSERA_API_KEY_SECRET.encode(), secret.encode(), hashlib.sha256).hexdigest()
    assert row.key_hash == expected != hashlib.sha256(secret.encode()).hexdigest()
    assert row.prefix == secret[:11] and secret[11:] not in row.prefix
    stored = " ".join(str(v) for v in APIKey.objects.filter(pk=row.pk).values().first().values())
    assert secret not in stored


def test_the_hash_depends_on_the_server_secret(settings):
    before = hash_secret("sk-abc")
    settings.TESSERA_API_KEY_SECRET = "another-secret"
    assert hash_secret("sk-abc") != before


def test_authenticate_finds_the_tenant_and_scopes(make_tenant):
    tenant = make_tenant()
    created = services.api_key_create(tenant=tenant, name="x", allowed_models=["m"], allowed_adapters=["a"])
    principal = auth.authenticate(created.secret)
    assert (principal.tenant_id, principal.key_id) == (tenant.pk, created.key.pk)
    assert principal.may_use("m") and principal.may_use("m", "a")
    assert not principal.may_use("other") and not principal.may_use("m", "b")
    with pytest.raises(ApplicationError) as exc:
        auth.authenticate(created.secret + "x")
    assert exc.value.status == 401 and exc.value.code == "invalid_api_key"


def test_rotation_keeps_the_old_key_for_the_grace_period(make_tenant):
    tenant = make_tenant()
    old = services.api_key_create(tenant=tenant, name="prod", allowed_models=["m"], can_manage=True)
    new = services.api_key_rotate(tenant=tenant, key=old.key, grace=timedelta(hours=1))
    assert new.secret != old.secret and new.key.rotated_from_id == old.key.pk
    assert (new.key.name, new.key.allowed_models, new.key.can_manage) == ("prod", ["m"], True)
    old.key.refresh_from_db()
    assert timezone.now() + timedelta(minutes=59) < old.key.expires_at <= timezone.now() + timedelta(hours=1)
    assert auth.authenticate(old.secret).key_id == old.key.pk  # still inside the grace period
    assert auth.authenticate(new.secret).key_id == new.key.pk
    APIKey.objects.filter(pk=old.key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(ApplicationError, match="expired"):
        auth.authenticate(old.secret)
    assert auth.authenticate(new.secret).key_id == new.key.pk


def test_rotation_never_extends_an_earlier_expiry(make_tenant):
    tenant = make_tenant()
    soon = timezone.now() + timedelta(minutes=5)
    old = services.api_key_create(tenant=tenant, name="k", expires_at=soon)
    services.api_key_rotate(tenant=tenant, key=old.key, grace=timedelta(days=1))
    old.key.refresh_from_db()
    assert old.key.expires_at == soon


def test_revoked_keys_are_refused_and_cannot_be_rotated(make_tenant):
    tenant = make_tenant()
    created = services.api_key_create(tenant=tenant, name="k")
    services.api_key_revoke(tenant=tenant, key=created.key)
    with pytest.raises(ApplicationError) as exc:
        auth.authenticate(created.secret)
    assert exc.value.status == 401
    with pytest.raises(ApplicationError) as exc:
        services.api_key_rotate(tenant=tenant, key=created.key)
    assert exc.value.status == 409


def test_a_tenant_cannot_touch_another_tenants_key(make_tenant):
    mine, theirs = make_tenant(), make_tenant()
    key = services.api_key_create(tenant=theirs, name="k").key
    for action in (services.api_key_revoke, services.api_key_rotate):
        with pytest.raises(ApplicationError) as exc:
            action(tenant=mine, key=key)
        assert exc.value.status == 404
    key.refresh_from_db()
    assert not key.revoked and key.expires_at is None


def test_suspension_refuses_every_key_of_the_tenant(make_tenant):
    tenant = make_tenant()
    created = services.api_key_create(tenant=tenant, name="k")
    services.tenant_suspend(tenant=tenant)
    with pytest.raises(ApplicationError) as exc:
        auth.authenticate(created.secret)
    assert exc.value.status == 403 and exc.value.code == "tenant_suspended"


def test_process_cache_is_cleared_by_services(make_tenant, settings, django_capture_on_commit_callbacks):
    settings.TESSERA_AUTH_CACHE_SECONDS = 60
    tenant = make_tenant()
    created = services.api_key_create(tenant=tenant, name="k")
    auth.authenticate(created.secret)
    assert auth.cached_lookup(created.secret)[0]  # served from the cache now
    with django_capture_on_commit_callbacks(execute=True):
        services.api_key_revoke(tenant=tenant, key=created.key)
    assert not auth.cached_lookup(created.secret)[0]
    with pytest.raises(ApplicationError):
        auth.authenticate(created.secret)


def test_effective_limits_apply_tenant_overrides(make_tier, make_tenant):
    from tenants.selectors import tenant_limits

    tier = make_tier(requests_per_minute=10, tokens_per_minute=1000, budget_enforcement="hard")
    tenant = make_tenant(tier=tier, requests_per_minute_override=99, budget_enforcement_override="soft")
    limits = tenant_limits(tenant=tenant)
    assert (limits.requests_per_minute, limits.tokens_per_minute, limits.hard_budget) == (99, 1000, False)


def test_seeded_tiers_exist():
    from tenants.models import Tier

    names = list(Tier.objects.filter(name__in=["free", "standard", "premium", "enterprise"]).values_list("name", flat=True))
    assert sorted(names) == ["enterprise", "free", "premium", "standard"]
    assert Tier.objects.get(name="enterprise").priority < Tier.objects.get(name="free").priority
