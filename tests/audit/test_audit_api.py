"""/api/v1/audit-events/: a tenant's key reads its own tenant's events only; operators and finance
read any tenant's and export everything as CSV or JSON Lines."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest

from controlplane.audit import context
from controlplane.audit.models import AuditEvent
from tenants import services

from .conftest import as_key, as_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(make_tenant, make_user):
    a, b = make_tenant(slug="acme"), make_tenant(slug="globex")
    a_key = services.api_key_create(tenant=a, name="a-admin", can_manage=True)
    b_key = services.api_key_create(tenant=b, name="b-admin", can_manage=True)
    operator = make_user("ops-erin", role="operator")
    as_user(operator).post("/api/v1/tenants/acme/suspend/")
    as_user(operator).post("/api/v1/tenants/acme/activate/")
    as_key(b_key.secret).post("/api/v1/keys/", {"name": "ci"}, format="json")
    return {"a": a, "b": b, "a_key": a_key, "b_key": b_key, "operator": operator,
            "finance": make_user("fin-frank", role="finance")}


def test_a_key_reads_only_its_own_tenant(world):
    a_events = as_key(world["a_key"].secret).get("/api/v1/audit-events/").json()
    assert a_events["count"] == AuditEvent.objects.filter(tenant_id=world["a"].pk).count() > 0
    assert {row["action"] for row in a_events["results"]} >= {"tenant.suspend", "tenant.activate", "api_key.create"}
    b_events = as_key(world["b_key"].secret).get("/api/v1/audit-events/").json()["results"]
    a_ids = {row["id"] for row in a_events["results"]}
    assert a_ids and not a_ids & {row["id"] for row in b_events}
    assert all(AuditEvent.objects.get(pk=row["id"]).tenant_id == world["b"].pk for row in b_events)
    smuggled = as_key(world["b_key"].secret).get("/api/v1/audit-events/?tenant=acme&tenant_id=1").json()["results"]
    assert {row["id"] for row in smuggled} == {row["id"] for row in b_events}  # query parameters pick no tenant
    # Another tenant's slug in the URL is an operator route: a key is refused, never served.
    assert as_key(world["b_key"].secret).get("/api/v1/tenants/acme/audit-events/").status_code == 403


def test_a_tenant_does_not_learn_who_the_operator_is(world):
    rows = as_key(world["a_key"].secret).get("/api/v1/audit-events/?action=tenant.suspend").json()["results"]
    assert len(rows) == 1
    assert rows[0]["actor"] == "operator" and rows[0]["actor_type"] == "user" and rows[0]["client_address"] is None
    assert "ops-erin" not in json.dumps(rows) and "203.0.113.9" not in json.dumps(rows)
    assert "actor_username" not in rows[0] and "via" not in rows[0]
    own = as_key(world["b_key"].secret).get("/api/v1/audit-events/?action=api_key.create").json()["results"]
    assert [row["client_address"] for row in own if row["actor_type"] == "api_key"] == ["198.51.100.7"]
    operator_view = as_user(world["operator"]).get("/api/v1/tenants/acme/audit-events/?action=tenant.suspend").json()
    assert {row["actor_username"] for row in operator_view["results"]} == {"ops-erin"}


def test_filters_and_pagination(world):
    client = as_key(world["a_key"].secret)
    assert {r["action"] for r in client.get("/api/v1/audit-events/?action=tenant").json()["results"]} == {
        "tenant.create", "tenant.suspend", "tenant.activate"}
    assert client.get("/api/v1/audit-events/?action=tenant.sus").json()["count"] == 0  # exact, not a prefix
    page = client.get("/api/v1/audit-events/?limit=1").json()
    assert len(page["results"]) == 1 and page["next"] and page["count"] > 1
    assert client.get("/api/v1/audit-events/?since=2999-01-01").json()["count"] == 0
    assert client.get("/api/v1/audit-events/?until=2000-01-01").json()["count"] == 0
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    assert client.get("/api/v1/audit-events/", {"until": now}).json()["count"] > 0
    for bad in ("since=yesterday", "until=2026-13-01", "since=2026-11-02&until=2026-11-01", "action=%00",
                "action=" + "x" * 65):
        response = client.get(f"/api/v1/audit-events/?{bad}")
        assert response.status_code == 400, bad


def test_finance_exports_csv_and_jsonl(world):
    from billing.services import price_create

    with context.system("test-seed"):
        services.tier_create(name="platform-wide", priority=2)  # no tenant: only in the full export
        price_create(model="=SUM(A1:A9)", input_per_mtok="1", cached_input_per_mtok="1", output_per_mtok="1",
                     effective_from=datetime(2026, 11, 1, tzinfo=UTC))
    finance = as_user(world["finance"])
    response = finance.get("/api/v1/audit-events/export.csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == AuditEvent.objects.count()
    assert [int(r["id"]) for r in rows] == sorted(int(r["id"]) for r in rows)  # oldest first
    tier_row = next(r for r in rows if r["action"] == "tier.create" and r["object_repr"] == "platform-wide")
    assert tier_row["actor"] == "system:test-seed" and json.loads(tier_row["changes"])["priority"] == [None, 2]
    formula = next(r for r in rows if r["action"] == "price.create")
    assert formula["object_repr"].startswith("'=SUM(A1:A9)")  # text in a spreadsheet, never a formula

    response = finance.get("/api/v1/audit-events/export.jsonl?tenant=acme&action=tenant")
    assert response.status_code == 200
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [line["action"] for line in lines] == ["tenant.create", "tenant.suspend", "tenant.activate"]
    assert {line["tenant_id"] for line in lines} == {world["a"].pk}
    assert lines[1]["changes"] == {"status": ["active", "suspended"]} and lines[1]["actor_username"] == "ops-erin"

    assert finance.get("/api/v1/audit-events/export.csv?tenant=nobody").status_code == 400
    assert as_key(world["a_key"].secret).get("/api/v1/audit-events/export.csv").status_code == 403
    assert as_key(world["a_key"].secret).get("/api/v1/audit-events/export.jsonl").status_code == 403


def test_export_command(world, tmp_path):
    from django.core.management import call_command

    target = tmp_path / "audit.jsonl"
    call_command("audit_export", "--format", "jsonl", "--out", str(target), "--tenant", "globex")
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert lines and {line["tenant_id"] for line in lines} == {world["b"].pk}


def test_schema_describes_the_endpoints(client):
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    for path in ("/api/v1/audit-events/", "/api/v1/tenants/{slug}/audit-events/", "/api/v1/audit-events/export.csv",
                 "/api/v1/audit-events/export.jsonl"):
        assert "get" in schema["paths"][path], path
    params = {p["name"] for p in schema["paths"]["/api/v1/audit-events/"]["get"]["parameters"]}
    assert {"action", "since", "until", "limit", "offset"} <= params
