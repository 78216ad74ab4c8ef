"""Audit events cannot be changed or removed by the application (model, queryset, admin, and on
PostgreSQL a trigger); only the retention prune removes them, by age."""

from __future__ import annotations

import io
import os
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from controlplane.audit import context, retention
from controlplane.audit.models import AuditEvent, AuditImmutableError
from controlplane.audit.writer import record
from tenants import services

pytestmark = pytest.mark.django_db


def _event(days_old: float = 0, action: str = "test.event") -> AuditEvent:
    with context.system("test"):
        event = record(action, type_="test", object_id=1, changes={"x": [1, 2]})
    if days_old:
        table = AuditEvent._meta.db_table
        with transaction.atomic(), connection.cursor() as cursor:  # backdate: only the prune's way through
            if connection.vendor == "postgresql":
                cursor.execute("SET LOCAL tessera.audit_prune = 'on'")
            cursor.execute(f"DELETE FROM {table} WHERE id = %s", [event.pk])
        AuditEvent.objects.create(**{f.attname: getattr(event, f.attname) for f in AuditEvent._meta.fields
                                     if f.attname not in ("id", "at")}, at=timezone.now() - timedelta(days=days_old))
        event = AuditEvent.objects.order_by("-id").first()
    return event


def test_the_model_and_queryset_refuse_changes():
    event = _event()
    event.action = "forged"
    with pytest.raises(AuditImmutableError):
        event.save()
    with pytest.raises(AuditImmutableError):
        event.delete()
    for attempt in (lambda qs: qs.update(action="forged"), lambda qs: qs.delete(),
                    lambda qs: qs.bulk_update([event], ["action"]),
                    lambda qs: qs.update_or_create(pk=event.pk, defaults={"action": "forged"})):
        with pytest.raises(AuditImmutableError):
            attempt(AuditEvent.objects.filter(pk=event.pk))
    assert AuditEvent.objects.get(pk=event.pk).action == "test.event"


def test_deleting_what_events_name_leaves_the_events(make_tenant, django_user_model):
    tenant = make_tenant()
    user = django_user_model.objects.create_user("gone")
    tenant_id = tenant.pk
    services.api_key_create(tenant=tenant, name="k")
    tenant_events = AuditEvent.objects.filter(tenant_id=tenant_id).count()
    tenant.delete()  # cascades to its keys; no foreign key reaches the audit table
    user.delete()
    assert AuditEvent.objects.filter(tenant_id=tenant_id).count() == tenant_events == 2
    assert AuditEvent.objects.filter(action="user.delete", object_repr="gone").count() == 1


def test_the_admin_is_read_only_even_for_a_superuser(admin_client, make_user):
    event = _event()
    assert admin_client.get("/admin/audit/auditevent/").status_code == 200
    assert admin_client.get("/admin/audit/auditevent/add/").status_code == 403
    page = admin_client.get(f"/admin/audit/auditevent/{event.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content  # a view page, no save button
    assert admin_client.post(f"/admin/audit/auditevent/{event.pk}/change/", {"action": "x"}).status_code == 403
    assert admin_client.post(f"/admin/audit/auditevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    admin_client.post("/admin/audit/auditevent/", {"action": "delete_selected", "_selected_action": [event.pk],
                                                   "post": "yes"})
    assert AuditEvent.objects.filter(pk=event.pk, action="test.event").exists()
    for role in ("operator", "finance"):
        user = make_user(f"{role}-viewer", role=role)
        assert user.has_perm("audit.view_auditevent")
        assert not {"audit.add_auditevent", "audit.change_auditevent", "audit.delete_auditevent"} & user.get_all_permissions()
    assert make_user("plain-staff", is_staff=True).has_perm("audit.view_auditevent") is False


@pytest.mark.postgres
def test_postgres_trigger_refuses_update_and_delete():
    if connection.vendor != "postgresql":
        message = "needs PostgreSQL (the test settings fell back to SQLite)"
        if os.environ.get("TESSERA_REQUIRE_SERVICES") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    event = _event()
    table = AuditEvent._meta.db_table
    for sql in (f"UPDATE {table} SET action = 'forged' WHERE id = %s", f"DELETE FROM {table} WHERE id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [event.pk])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL tessera.audit_prune = 'on'")  # the prune's setting lets DELETE through, not UPDATE
        cursor.execute(f"UPDATE {table} SET action = 'forged' WHERE id = %s", [event.pk])
    with transaction.atomic(), connection.cursor() as cursor:  # a setting from an earlier transaction is gone
        cursor.execute("SELECT current_setting('tessera.audit_prune', true)")
        assert cursor.fetchone()[0] in (None, "")
    assert AuditEvent.objects.get(pk=event.pk).action == "test.event"


def test_prune_by_age_command_and_task(settings):
    old, recent = _event(days_old=401), _event(days_old=399)
    settings.TESSERA_AUDIT_RETENTION_DAYS = 400
    out = io.StringIO()
    call_command("audit_prune", stdout=out)
    assert out.getvalue().startswith("1 audit event(s) deleted")
    assert not AuditEvent.objects.filter(pk=old.pk).exists() and AuditEvent.objects.filter(pk=recent.pk).exists()
    pruned = AuditEvent.objects.get(action="audit.prune")
    assert pruned.actor == "system:manage.py audit_prune" and pruned.changes == {"removed": [None, 1],
                                                                                "retention_days": [None, 400]}

    from controlplane.audit import tasks

    assert tasks.prune.apply(kwargs={"days": 398}).get() == 1
    assert not AuditEvent.objects.filter(pk=recent.pk).exists()
    assert tasks.prune.acks_late and tasks.prune.max_retries == 5
    settings.TESSERA_AUDIT_RETENTION_DAYS = 0  # keep for ever
    _event(days_old=5000)
    assert retention.audit_events_prune() == 0
    with pytest.raises(Exception, match="at least 1"):
        call_command("audit_prune", "--days", "0")


def test_redaction():
    from controlplane.audit.redact import REDACTED, redact_changes, scrub

    changes = redact_changes({
        "tokens_per_minute": [1, 2], "monthly_token_budget": [None, 5], "key_hash": ["a" * 64, "b" * 64],
        "password": ["x", "y"], "cache_salt": [None, "s"], "note": ["", "new key sk-AbCdEfGhIjKlMnOpQrStUv"],
        "source": ["", "https://user:hunter2@store.example/adapters/a"],
        "engine_args": [{}, {"hf_token": "hf_abc", "block_size": 16}],
    })
    assert changes["tokens_per_minute"] == [1, 2] and changes["monthly_token_budget"] == [None, 5]
    assert changes["key_hash"] == changes["password"] == [REDACTED, REDACTED]
    assert changes["cache_salt"] == [None, REDACTED]
    assert changes["note"] == ["", f"new key {REDACTED}"]
    assert changes["source"] == ["", f"https://{REDACTED}@store.example/adapters/a"]
    assert changes["engine_args"] == [{}, {"hf_token": REDACTED, "block_size": 16}]
    assert scrub("Bearer abcdefghijkl and whsec_0123456789 and sk_live_abcdefghij") == " and ".join([REDACTED] * 3)


def test_client_address_believes_forwarded_for_only_behind_trusted_proxies(make_user, settings):
    settings.TESSERA_TRUSTED_PROXY_HOPS = 0
    from rest_framework.test import APIClient

    services.tier_create(name="fwd", priority=3)
    client = APIClient(REMOTE_ADDR="10.0.0.2")
    client.force_login(make_user("ops-fwd", role="operator"))
    forged = {"HTTP_X_FORWARDED_FOR": "6.6.6.6, 192.0.2.44"}
    client.patch("/api/v1/tiers/fwd/", {"priority": 4}, format="json", **forged)
    settings.TESSERA_TRUSTED_PROXY_HOPS = 1
    client.patch("/api/v1/tiers/fwd/", {"priority": 5}, format="json", **forged)
    client.patch("/api/v1/tiers/fwd/", {"priority": 6}, format="json", HTTP_X_FORWARDED_FOR="not-an-address")
    addresses = list(AuditEvent.objects.filter(action="tier.update").order_by("id").values_list("client_address",
                                                                                                flat=True))
    assert addresses == ["10.0.0.2", "192.0.2.44", "10.0.0.2"]  # junk in the header: the peer


def test_nothing_recorded_when_nothing_changed(make_tenant):
    tenant = make_tenant()
    services.tenant_update(tenant=tenant, name=tenant.name)
    services.tenant_activate(tenant=tenant)  # already active
    assert not AuditEvent.objects.filter(action__in=["tenant.update", "tenant.activate"]).exists()


def test_a_change_that_fails_leaves_no_event(make_tenant):
    tenant = make_tenant()
    with pytest.raises(RuntimeError), transaction.atomic():
        services.tenant_suspend(tenant=tenant)
        raise RuntimeError("the caller's transaction fails after the change")
    assert not AuditEvent.objects.filter(action="tenant.suspend").exists()


def test_group_membership_from_either_side(make_user):
    from django.contrib.auth.models import Group

    operators = Group.objects.get(name="operator")
    user = make_user("eve")
    with context.system("test-m2m"):
        operators.user_set.add(user)
        operators.user_set.clear()
        user.groups.add(operators)
        user.groups.clear()
    actions = [(e.action, e.changes) for e in AuditEvent.objects.filter(object_repr="eve").order_by("id")
               if e.action.startswith("role.")]
    grant, revoke = {"groups": [[], ["operator"]]}, {"groups": [["operator"], []]}
    assert actions == [("role.grant", grant), ("role.revoke", revoke), ("role.grant", grant), ("role.revoke", revoke)]
