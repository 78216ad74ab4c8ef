"""Management API: operators own models, workers and deployments; tenants own (only) their adapters."""

from __future__ import annotations

import pytest

from controlplane.deployments.models import Adapter, Deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def op(client, operator):
    client.force_login(operator)
    return client


def bearer(secret: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def test_operators_register_models_and_deploy_them(op, make_worker, sent):
    make_worker("w1")
    created = op.post("/api/v1/models/", {"name": "smollm2-135m-instruct", "quantizations": ["bf16", "fp8"]},
                      content_type="application/json")
    assert created.status_code == 201 and created.json()["source"] == "smollm2-135m-instruct"
    assert created.json()["source_kind"] == "alias"
    deployed = op.post("/api/v1/deployments/", {"model": "smollm2-135m-instruct", "replicas": 2,
                                                "quantization": "fp8"}, content_type="application/json")
    body = deployed.json()
    assert deployed.status_code == 201 and body["name"] == "smollm2-135m-instruct-fp8" and body["replicas"] == 2
    refused = op.post("/api/v1/deployments/", {"model": "smollm2-135m-instruct", "quantization": "awq"},
                      content_type="application/json")
    assert refused.status_code == 400 and refused.json()["code"] == "quantization_unavailable"
    scaled = op.patch("/api/v1/deployments/smollm2-135m-instruct-fp8/", {"replicas": 1},
                      content_type="application/json")
    assert scaled.status_code == 200 and scaled.json()["replicas"] == 1
    bad = op.patch("/api/v1/deployments/smollm2-135m-instruct-fp8/", {"placement": {"gpu": 1}},
                   content_type="application/json")
    assert bad.status_code == 400 and "placement" in bad.json()["detail"]
    assert op.get("/api/v1/workers/").json()["results"][0]["name"] == "w1"
    assert op.post("/api/v1/workers/w1/drain/").json()["cordoned"] is True
    assert op.delete("/api/v1/deployments/smollm2-135m-instruct-fp8/").status_code == 202
    assert Deployment.objects.get().deleting
    assert op.delete("/api/v1/models/smollm2-135m-instruct/").json()["code"] == "model_in_use"


def test_tenants_cannot_reach_operator_routes(client, make_tenant, make_model):
    make_model()
    _, created = make_tenant()
    for path in ("/api/v1/models/", "/api/v1/workers/", "/api/v1/deployments/"):
        assert client.get(path, **bearer(created.secret)).status_code == 403
        assert client.get(path).status_code == 401


def test_tenants_manage_only_their_own_adapters(client, op, make_tenant, make_model):
    make_model()
    acme, acme_key = make_tenant("Acme")
    other, other_key = make_tenant("Other")
    made = client.post("/api/v1/adapters/", {"name": "sql", "base_model": "smollm2-135m-instruct",
                                             "source": "sql", "rank": 8},
                       content_type="application/json", **bearer(acme_key.secret))
    assert made.status_code == 201 and made.json()["served_name"] == "acme:sql"
    adapter_id = made.json()["id"]
    assert [a["name"] for a in client.get("/api/v1/adapters/", **bearer(acme_key.secret)).json()["results"]] == ["sql"]
    assert client.get("/api/v1/adapters/", **bearer(other_key.secret)).json()["results"] == []
    assert client.get(f"/api/v1/adapters/{adapter_id}/", **bearer(other_key.secret)).status_code == 404
    assert client.delete(f"/api/v1/adapters/{adapter_id}/", **bearer(other_key.secret)).status_code == 404
    assert op.get(f"/api/v1/tenants/{acme.slug}/adapters/").json()["results"][0]["served_name"] == "acme:sql"
    assert op.get(f"/api/v1/tenants/{other.slug}/adapters/{adapter_id}/").status_code == 404
    assert client.delete(f"/api/v1/adapters/{adapter_id}/", **bearer(acme_key.secret)).status_code == 202
    assert not Adapter.objects.exists()  # nothing was loaded anywhere: removed at once


def test_the_openapi_schema_lists_the_deployment_routes(op):
    schema = op.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    assert {"/api/v1/deployments/", "/api/v1/models/", "/api/v1/adapters/"} <= set(schema["paths"])
    assert not any(path.startswith("/internal/") for path in schema["paths"])
