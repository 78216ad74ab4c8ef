"""Each kind of change through each door (management API, admin, manage.py, Celery) leaves one
audit event naming the right actor and origin, with before -> after and no secret."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from tenants import services
from tenants.models import APIKey

from .conftest import as_key, as_user, events, holds_no_secret, one

pytestmark = pytest.mark.django_db


# --- management API -------------------------------------------------------------------------------

def test_api_operator_changes_tier_limits(make_user):
    services.tier_create(name="gold", priority=3, requests_per_minute=60)
    operator = make_user("ops-alice", role="operator")
    response = as_user(operator).patch("/api/v1/tiers/gold/", {"requests_per_minute": 120,
                                                               "monthly_spend_budget": "250.00"}, format="json",
                                       HTTP_X_REQUEST_ID="forged-id")
    assert response.status_code == 200, response.content
    event = one("tier.update")
    assert (event.actor_type, event.actor, event.actor_user_id, event.actor_username) == (
        "user", "user:ops-alice", operator.pk, "ops-alice")
    assert event.changes == {"requests_per_minute": [60, 120], "monthly_spend_budget": [None, "250.00"]}
    assert (event.channel, event.via, event.client_address) == ("api", "PATCH /api/v1/tiers/gold/", "203.0.113.9")
    assert event.request_id == response["X-Request-Id"] != "forged-id"  # the server names its requests
    assert event.object_repr == "gold" and event.tenant_id is None


def test_api_tenant_key_mints_rescopes_and_revokes(tenant):
    manager = services.api_key_create(tenant=tenant, name="admin", can_manage=True)
    client = as_key(manager.secret)
    response = client.post("/api/v1/keys/", {"name": "ci", "allowed_models": ["m1"]}, format="json")
    assert response.status_code == 201
    secret, key_id = response.json()["api_key"], response.json()["id"]
    minted = one("api_key.create", object_id=str(key_id))
    assert (minted.actor_type, minted.actor_key_id, minted.actor_key_prefix) == ("api_key", manager.key.pk,
                                                                                 manager.key.prefix)
    assert minted.actor == f"key:{manager.key.prefix} ({tenant.slug})" and minted.tenant_id == tenant.pk
    assert minted.changes["allowed_models"] == [None, ["m1"]] and minted.changes["can_manage"] == [None, False]
    assert minted.changes["key_hash"] == [None, "[redacted]"]
    assert holds_no_secret(minted, secret, APIKey.objects.get(pk=key_id).key_hash, manager.secret)
    assert minted.client_address == "198.51.100.7" and minted.channel == "api"

    assert client.patch(f"/api/v1/keys/{key_id}/", {"allowed_models": ["m1", "m2"]}, format="json").status_code == 200
    assert one("api_key.update").changes == {"allowed_models": [["m1"], ["m1", "m2"]]}
    assert client.post(f"/api/v1/keys/{key_id}/revoke/").status_code == 200
    revoked = one("api_key.revoke")
    assert revoked.changes["revoked"] == [False, True] and revoked.changes["revoked_at"][0] is None

    rotated = client.post(f"/api/v1/keys/{manager.key.pk}/rotate/", {"grace_seconds": 60}, format="json").json()
    new, old = one("api_key.rotate"), one("api_key.rotate_out")
    assert new.object_id == str(rotated["id"]) and new.changes["rotated_from"] == [None, manager.key.pk]
    assert old.object_id == str(manager.key.pk) and old.changes["expires_at"][0] is None
    assert holds_no_secret(new, rotated["api_key"]) and holds_no_secret(old, rotated["api_key"])


def test_api_operator_creates_suspends_and_reactivates_a_tenant(make_user):
    services.tier_create(name="std", priority=5)
    operator = make_user("ops-bob", role="operator")
    client = as_user(operator)
    created = client.post("/api/v1/tenants/", {"name": "Acme", "tier": "std"}, format="json").json()
    tenant_event = one("tenant.create")
    assert tenant_event.changes["status"] == [None, "active"] and tenant_event.changes["cache_salt"] == [
        None, "[redacted]"]
    assert holds_no_secret(one("api_key.create"), created["api_key"])
    assert client.post("/api/v1/tenants/acme/suspend/").status_code == 200
    assert client.post("/api/v1/tenants/acme/activate/").status_code == 200
    suspended, activated = one("tenant.suspend"), one("tenant.activate")
    assert suspended.changes == {"status": ["active", "suspended"]}
    assert activated.changes == {"status": ["suspended", "active"]}
    assert suspended.actor == activated.actor == "user:ops-bob" and suspended.request_id != activated.request_id
    assert suspended.tenant_id == created["tenant"]["id"]
    client.patch("/api/v1/tenants/acme/", {"requests_per_minute_override": 5}, format="json")
    assert one("tenant.update").changes == {"requests_per_minute_override": [None, 5]}


def test_api_deployments(make_user, no_broker):
    client = as_user(make_user("ops-carol", role="operator"))
    assert client.post("/api/v1/models/", {"name": "m-audit"}, format="json").status_code == 201
    assert client.post("/api/v1/deployments/", {"model": "m-audit", "replicas": 1}, format="json").status_code == 201
    assert client.patch("/api/v1/deployments/m-audit/", {"replicas": 3}, format="json").status_code == 200
    assert client.delete("/api/v1/deployments/m-audit/").status_code == 202
    assert one("model.create").actor == "user:ops-carol"
    assert one("deployment.create").changes["desired_replicas"] == [None, 1]
    assert one("deployment.update").changes == {"desired_replicas": [1, 3]}
    assert one("deployment.delete").changes == {"deleting": [False, True], "desired_replicas": [3, 0]}


def test_a_refused_change_leaves_no_event(tenant, make_tenant):
    other = make_tenant()
    manager = services.api_key_create(tenant=tenant, name="admin", can_manage=True)
    victim = services.api_key_create(tenant=other, name="victim")
    before = len(events("api_key.revoke"))
    assert as_key(manager.secret).post(f"/api/v1/keys/{victim.key.pk}/revoke/").status_code == 404
    assert len(events("api_key.revoke")) == before


# --- admin (Django test client, a superuser) -------------------------------------------------------

def test_admin_actions_and_forms(admin_client, admin_user, tenant):
    created = services.api_key_create(tenant=tenant, name="k")
    admin_client.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [tenant.pk]})
    admin_client.post("/admin/tenants/apikey/", {"action": "revoke", "_selected_action": [created.key.pk]})
    for action in ("tenant.suspend", "api_key.revoke"):
        event = one(action)
        assert (event.actor, event.actor_user_id, event.channel) == ("user:admin", admin_user.pk, "admin")
        assert event.via.startswith("POST /admin/tenants/") and event.client_address == "127.0.0.1"
    tier = tenant.tier
    form = {"name": tier.name, "description": "", "priority": 1, "requests_per_minute": 42, "tokens_per_minute": "",
            "max_concurrent_requests": "", "monthly_token_budget": "", "monthly_spend_budget": "9.99",
            "budget_enforcement": "soft", "slo_ttft_p95_ms": "", "slo_itl_p95_ms": "", "slo_availability_pct": "",
            "fair_share_weight": 1}
    response = admin_client.post(f"/admin/tenants/tier/{tier.pk}/change/", form)
    assert response.status_code == 302, response.content[-3000:]
    assert one("tier.update").changes == {"priority": [5, 1], "requests_per_minute": [None, 42],
                                          "monthly_spend_budget": [None, "9.99"],
                                          "budget_enforcement": ["hard", "soft"]}


def test_admin_key_form_records_the_stored_before(admin_client, tenant):
    """The admin's form has already changed the instance the service gets: before is read from the database."""
    created = services.api_key_create(tenant=tenant, name="form-key", allowed_models=["m1"])
    response = admin_client.post(f"/admin/tenants/apikey/{created.key.pk}/change/", {
        "name": "form-key", "allowed_models": '["m1", "m2"]', "allowed_adapters": "[]", "can_manage": "on",
        "expires_at_0": "", "expires_at_1": ""})
    assert response.status_code == 302, response.content[-3000:]
    event = one("api_key.update")
    assert event.changes == {"allowed_models": [["m1"], ["m1", "m2"]], "can_manage": [False, True]}
    assert event.actor == "user:admin" and event.channel == "admin"


def test_admin_deletes_a_key_and_a_tenant(admin_client, tenant):
    created = services.api_key_create(tenant=tenant, name="doomed")
    response = admin_client.post(f"/admin/tenants/apikey/{created.key.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not APIKey.objects.filter(pk=created.key.pk).exists()
    deleted = one("api_key.delete")
    assert deleted.object_id == str(created.key.pk) and deleted.tenant_id == tenant.pk
    assert deleted.changes["name"] == ["doomed", None] and deleted.changes["key_hash"] == ["[redacted]", None]
    assert holds_no_secret(deleted, created.secret, created.key.key_hash)
    admin_client.post("/admin/tenants/tenant/", {"action": "delete_selected", "_selected_action": [tenant.pk],
                                                 "post": "yes"})
    gone = one("tenant.delete")
    assert gone.object_id == str(tenant.pk) and gone.changes["slug"] == [tenant.slug, None]
    assert gone.actor == "user:admin"


def test_admin_price_and_user_role_changes(admin_client, make_user):
    from django.contrib.auth.models import Group

    response = admin_client.post("/admin/billing/price/add/", {
        "model": "m-price", "adapter": "", "tier": "", "currency": "usd", "input_per_mtok": "0.10",
        "cached_input_per_mtok": "0.05", "output_per_mtok": "0.40", "effective_from_0": "2026-11-01",
        "effective_from_1": "00:00:00", "effective_to_0": "", "effective_to_1": "", "note": ""})
    assert response.status_code == 302, response.content[-3000:]
    price = one("price.create")
    assert price.changes["output_per_mtok"] == [None, "0.4000000000"] and price.channel == "admin"

    bob = make_user("bob")
    finance = Group.objects.get(name="finance")
    response = admin_client.post(f"/admin/auth/user/{bob.pk}/change/", {
        "username": "bob", "first_name": "", "last_name": "", "email": "", "is_active": "on", "is_staff": "on",
        "is_superuser": "on", "groups": [finance.pk], "user_permissions": [],
        "date_joined_0": "2026-11-01", "date_joined_1": "00:00:00", "initial-date_joined_0": "2026-11-01",
        "initial-date_joined_1": "00:00:00", "last_login_0": "", "last_login_1": ""})
    assert response.status_code == 302, response.content[-3000:]
    changed = one("user.update", object_id=str(bob.pk))
    assert changed.changes == {"is_staff": [False, True], "is_superuser": [False, True]}
    grant = one("role.grant", object_id=str(bob.pk))
    assert grant.changes == {"groups": [[], ["finance"]]} and grant.actor == "user:admin"


def test_a_password_change_is_recorded_without_the_password(make_user):
    user = make_user("carol")
    old_hash = user.password
    user.set_password("n3w-s3cret-pass")
    user.save()
    event = one("user.update", object_id=str(user.pk))
    assert event.changes == {"password": ["[redacted]", "[redacted]"]}
    assert holds_no_secret(event, old_hash, user.password, "n3w-s3cret-pass")


# --- manage.py --------------------------------------------------------------------------------------

def test_cli_commands(tenant, make_user, no_broker):
    out = io.StringIO()
    call_command("key_create", "--tenant", tenant.slug, "--name", "cli-key", "--manage", stdout=out)
    secret = json.loads(out.getvalue())["api_key"]
    minted = one("api_key.create", object_repr__contains="cli-key")
    assert (minted.actor_type, minted.actor, minted.channel) == ("system", "system:manage.py key_create", "cli")
    assert minted.via.startswith("manage.py key_create (os user ") and minted.request_id
    assert minted.changes["can_manage"] == [None, True] and holds_no_secret(minted, secret)

    call_command("tenant_suspend", "--tenant", tenant.slug, stdout=io.StringIO())
    assert one("tenant.suspend").actor == "system:manage.py tenant_suspend"

    make_user("dave")
    call_command("role_grant", "--user", "dave", "--role", "operator", stdout=io.StringIO())
    grant, staff = one("role.grant"), one("user.update", object_repr="dave")
    assert grant.changes == {"groups": [[], ["operator"]]} and staff.changes == {"is_staff": [False, True]}
    assert grant.actor == staff.actor == "system:manage.py role_grant" and grant.request_id == staff.request_id

    call_command("deploy", "--model", "m-cli", "--replicas", "2", stdout=io.StringIO())
    assert one("deployment.create").actor == one("model.create").actor == "system:manage.py deploy"


# --- Celery -----------------------------------------------------------------------------------------

def test_celery_tasks_finalize_and_map_the_stripe_customer(price, make_event, ingest, tenant, fake_stripe,
                                                           no_retry_sleep):
    from billing import tasks

    ingest(make_event())
    result = tasks.invoices_build_month.apply(kwargs={"month": "2026-11", "finalize": True})
    invoice_id = result.get()[0]
    finalized = one("invoice.finalize", object_id=str(invoice_id))
    assert (finalized.actor, finalized.channel) == ("system:task billing.invoices_build_month", "task")
    assert finalized.request_id == result.id and finalized.tenant_id == tenant.pk
    assert finalized.changes["status"] == ["draft", "finalized"] and finalized.changes["number"] == [
        None, f"TSR-202611-{tenant.pk}-{invoice_id}"]

    synced = tasks.stripe_invoice_sync.apply(args=[invoice_id])
    synced.get()
    mapping = one("stripe_customer.create")
    assert mapping.actor == "system:task billing.stripe_invoice_sync" and mapping.request_id == synced.id
    assert mapping.tenant_id == tenant.pk and mapping.changes["stripe_customer_id"][1].startswith("cus_")
    assert holds_no_secret(mapping, "sk_test_local")


def test_money_through_the_admin_and_the_cli(price, make_event, ingest, tenant, admin_client):
    from billing.models import Invoice

    ingest(make_event())
    call_command("billing_invoices", "--month", "2026-11", "--finalize", stdout=io.StringIO())
    invoice = Invoice.objects.get()
    finalized = one("invoice.finalize")
    assert finalized.actor == "system:manage.py billing_invoices" and finalized.channel == "cli"
    assert set(finalized.changes) == {"status", "number", "finalized_at"}  # the total was built before
    admin_client.post("/admin/billing/invoice/", {"action": "void", "_selected_action": [invoice.pk]})
    voided = one("invoice.void")
    assert voided.actor == "user:admin" and voided.channel == "admin" and voided.tenant_id == tenant.pk
    assert voided.changes["status"] == ["finalized", "void"] and voided.changes["void_reason"] == ["",
                                                                                                   "voided by admin"]
