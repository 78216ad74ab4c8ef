"""Every /api/v1 endpoint × every kind of caller, asserted cell by cell against the table below.

Endpoints come from the URL resolver, so a new endpoint (or method) without a row fails
`test_every_endpoint_has_a_row`. A cell is the status the caller gets, aimed at tenant A's objects:
`2xx`, `400` (passed the permission check, the empty body is refused), `401`, `403`, `404`
(a tenant key never learns that another tenant's object exists), `405`, `409` (a state conflict).

Columns: anonymous, plain staff (is_staff, no role), finance, operator, superuser, A's can_manage
key, B's can_manage key (another tenant). Real database; each cell runs in its own transaction.
"""

from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

CALLERS = ("anon", "staff", "finance", "operator", "superuser", "key", "other_key")

# Views that are not DRF classes: the methods they answer (anything else is a 405 by design).
FUNCTION_VIEW_METHODS = {"billing:stripe-webhook": ("post",)}

# (url name, method): statuses for anon, staff, finance, operator, superuser, key, other_key
OP = ("401", "403", "403", "2xx", "2xx", "403", "403")  # operators only
OP_400 = ("401", "403", "403", "400", "400", "403", "403")  # operators only; the empty body is refused
FIN = ("401", "403", "2xx", "2xx", "2xx", "403", "403")  # finance and operators
FIN_400 = ("401", "403", "400", "400", "400", "403", "403")
KEY = ("401", "403", "403", "403", "403", "2xx", "2xx")  # a tenant's own key, its own tenant
KEY_400 = ("401", "403", "403", "403", "403", "400", "400")
KEY_OBJ = ("401", "403", "403", "403", "403", "2xx", "404")  # an object of A's: B's key never sees it
PUBLIC = ("2xx",) * 7
WEBHOOK = ("400",) * 7  # authenticated by Stripe's signature, not by a role

MATRIX: dict[tuple[str, str], tuple[str, ...]] = {
    # tenants/api: a tenant's own key (the tenant comes from the key)
    ("tenants-api:me", "get"): KEY,
    ("tenants-api:usage", "get"): KEY,
    ("tenants-api:keys", "get"): KEY,
    ("tenants-api:keys", "post"): KEY_400,
    ("tenants-api:key-detail", "get"): KEY_OBJ,
    ("tenants-api:key-detail", "patch"): KEY_OBJ,
    ("tenants-api:key-revoke", "post"): KEY_OBJ,
    ("tenants-api:key-rotate", "post"): KEY_OBJ,
    # tenants/api: operators, any tenant; finance reads usage only
    ("tenants-api:tenants", "get"): OP,
    ("tenants-api:tenants", "post"): OP_400,
    ("tenants-api:tenant-detail", "get"): OP,
    ("tenants-api:tenant-detail", "patch"): OP,
    ("tenants-api:tenant-suspend", "post"): OP,
    ("tenants-api:tenant-activate", "post"): OP,
    ("tenants-api:tenant-usage", "get"): FIN,
    ("tenants-api:tenant-keys", "get"): OP,
    ("tenants-api:tenant-keys", "post"): OP_400,
    ("tenants-api:tenant-key-detail", "get"): OP,
    ("tenants-api:tenant-key-detail", "patch"): OP,
    ("tenants-api:tenant-key-revoke", "post"): OP,
    ("tenants-api:tenant-key-rotate", "post"): OP,
    ("tenants-api:tiers", "get"): OP,
    ("tenants-api:tiers", "post"): OP_400,
    ("tenants-api:tier-detail", "get"): OP,
    ("tenants-api:tier-detail", "patch"): OP,
    # billing: finance exports
    ("billing:export-usage-csv", "get"): FIN,
    ("billing:export-usage-parquet", "get"): FIN,
    ("billing:export-invoices-csv", "get"): FIN,
    ("billing:export-invoices-parquet", "get"): FIN,
    # billing: unit economics (finance and operators) and the worker-class rate book (operators add)
    ("billing:unit-economics", "get"): FIN,
    ("billing:export-unit-economics-tenants-csv", "get"): FIN,
    ("billing:export-unit-economics-tenants-parquet", "get"): FIN,
    ("billing:export-unit-economics-deployments-csv", "get"): FIN,
    ("billing:export-unit-economics-deployments-parquet", "get"): FIN,
    ("billing:worker-rates", "get"): FIN,
    ("billing:worker-rates", "post"): OP_400,
    ("billing:stripe-webhook", "post"): WEBHOOK,
    # slo: operators see every tenant, a key its own
    ("slo:status", "get"): ("401", "403", "403", "2xx", "2xx", "2xx", "2xx"),
    # deployments: operators only; adapters like keys (own tenant, or operators under tenants/<slug>/)
    ("deployments-api:models", "get"): OP,
    ("deployments-api:models", "post"): OP_400,
    ("deployments-api:model-detail", "get"): OP,
    ("deployments-api:model-detail", "patch"): OP,
    ("deployments-api:model-detail", "delete"): ("401", "403", "403", "409", "409", "403", "403"),  # in use
    ("deployments-api:workers", "get"): OP,
    ("deployments-api:worker-detail", "get"): OP,
    ("deployments-api:worker-drain", "post"): OP,
    ("deployments-api:worker-uncordon", "post"): OP,
    ("deployments-api:deployments", "get"): OP,
    ("deployments-api:deployments", "post"): OP_400,
    ("deployments-api:deployment-detail", "get"): OP,
    ("deployments-api:deployment-detail", "patch"): OP,
    ("deployments-api:deployment-detail", "delete"): OP,
    ("deployments-api:replica-retry", "post"): OP,
    ("deployments-api:adapters", "get"): KEY,
    ("deployments-api:adapters", "post"): KEY_400,
    ("deployments-api:adapter-detail", "get"): KEY_OBJ,
    ("deployments-api:adapter-detail", "delete"): KEY_OBJ,
    ("deployments-api:tenant-adapters", "get"): OP,
    ("deployments-api:tenant-adapters", "post"): OP_400,
    ("deployments-api:tenant-adapter-detail", "get"): OP,
    ("deployments-api:tenant-adapter-detail", "delete"): OP,
    # audit log: a key reads its own tenant's events; operators and finance any tenant's, and export
    ("audit-api:events", "get"): KEY,
    ("audit-api:tenant-events", "get"): FIN,
    ("audit-api:export-csv", "get"): FIN,
    ("audit-api:export-jsonl", "get"): FIN,
    # the OpenAPI schema and its docs describe the API and hold no data: public
    ("schema", "get"): PUBLIC,
    ("api-docs", "get"): PUBLIC,
    ("api-redoc", "get"): PUBLIC,
}


def api_endpoints() -> dict[tuple[str, str], str]:
    """(url name, method) -> route, for every route under /api/v1/ the resolver knows."""
    found: dict[tuple[str, str], str] = {}

    def walk(patterns, prefix: str, namespace: str | None) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                ns = pattern.namespace or namespace
                walk(pattern.url_patterns, route, ns if pattern.namespace else namespace)
                continue
            assert isinstance(pattern, URLPattern)
            if not route.startswith("api/v1/"):
                continue
            name = f"{namespace}:{pattern.name}" if namespace else pattern.name
            view = getattr(pattern.callback, "cls", None) or getattr(pattern.callback, "view_class", None)
            if view is None:
                methods = FUNCTION_VIEW_METHODS.get(name, ("get", "post", "put", "patch", "delete"))
            else:
                methods = [m for m in ("get", "post", "put", "patch", "delete") if hasattr(view, m)]
            for method in methods:
                found[(name, method)] = route

    walk(get_resolver().url_patterns, "", None)
    return found


def test_every_endpoint_has_a_row():
    endpoints = api_endpoints()
    missing = sorted(set(endpoints) - set(MATRIX))
    stale = sorted(set(MATRIX) - set(endpoints))
    assert not missing, f"endpoints without a row in MATRIX: {missing}"
    assert not stale, f"rows for endpoints that no longer exist: {stale}"
    assert all(len(row) == len(CALLERS) for row in MATRIX.values())


@pytest.fixture
def world(make_tenant, make_user, monkeypatch, settings):
    from controlplane.deployments import dispatch
    from controlplane.deployments import services as deployments
    from controlplane.deployments.models import Adapter, Replica
    from tenants import services

    monkeypatch.setattr(dispatch, "send", lambda *args, **kwargs: None)  # no broker
    settings.STRIPE_WEBHOOK_SECRET = "whsec_matrix"  # configured: an unsigned call is a 400 for anyone
    a, b = make_tenant(), make_tenant()
    model = deployments.model_create(name="m-matrix")
    worker = deployments.worker_register(name="w-matrix", url="http://w-matrix.test:8100", boot_id="boot-1",
                                         accelerator="cpu", memory_bytes=16 * 2**30, status="ready")
    deployment = deployments.deployment_create(model=model, replicas=0)
    replica = Replica.objects.create(deployment=deployment, status="failed")
    adapter = Adapter.objects.create(tenant=a, name="ad", served_name=f"{a.slug}:ad", base_model=model, source="x")
    return {
        "a": a, "model": model, "worker": worker, "deployment": deployment, "replica": replica, "adapter": adapter,
        "a_target": services.api_key_create(tenant=a, name="target").key,
        "key": services.api_key_create(tenant=a, name="a-admin", can_manage=True).secret,
        "other_key": services.api_key_create(tenant=b, name="b-admin", can_manage=True).secret,
        "staff": make_user("staff", is_staff=True),
        "finance": make_user("finance", role="finance"),
        "operator": make_user("operator", role="operator"),
        "superuser": make_user("root", is_staff=True, is_superuser=True),
    }


def url_for(name: str, route: str, w: dict) -> str:
    values = {
        "slug": w["a"].slug, "key_id": w["a_target"].pk, "adapter_id": w["adapter"].pk,
        "replica_id": w["replica"].pk,
        "name": {"tier": w["a"].tier.name, "model": w["model"].name, "worker": w["worker"].name,
                 "deployment": w["deployment"].name, "replica": w["deployment"].name}.get(name.split(":")[-1].split("-")[0]),
    }
    kwargs = {k: v for k, v in values.items() if f"<{k}>" in route or f":{k}>" in route}
    url = reverse(name, kwargs=kwargs)
    if "unit-economics" in name:
        return url + "?month=2026-11"
    return url + ("?from=2026-11-01&to=2026-12-01" if "export" in name else "")


def client_for(caller: str, w: dict) -> APIClient:
    client = APIClient()
    if caller in ("key", "other_key"):
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {w[caller]}")
    elif caller != "anon":
        client.force_login(w[caller])  # session auth, as the admin's users log in
    return client


def status_class(code: int) -> str:
    return "2xx" if 200 <= code < 300 else str(code)


CELLS = [(name, method, caller) for (name, method) in MATRIX for caller in CALLERS]


@pytest.mark.parametrize(("name", "method", "caller"), CELLS, ids=[f"{n}-{m}-{c}" for n, m, c in CELLS])
def test_cell(world, name, method, caller):
    route = api_endpoints()[(name, method)]
    url = url_for(name, route, world)
    response = getattr(client_for(caller, world), method)(url, {} if method != "get" else None, format="json")
    expected = MATRIX[(name, method)][CALLERS.index(caller)]
    assert status_class(response.status_code) == expected, (
        f"{method.upper()} {url} as {caller}: {response.status_code} {getattr(response, 'content', b'')[:300]!r}"
    )
