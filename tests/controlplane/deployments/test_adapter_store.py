"""Adapter sources come from the tenant's own folder of the operator's store; tenants never see the
worker's file system in a failure; one tenant cannot take every adapter slot."""

from __future__ import annotations

import pytest

from controlplane.deployments import reconciler, services
from controlplane.deployments.models import Adapter, AdapterPlacement, Replica
from dataplane.worker.agent.slot import EngineSlot, LoadError
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState

pytestmark = pytest.mark.django_db

MODEL = "smollm2-135m-instruct"
INLINE = {"placements-TOTAL_FORMS": 0, "placements-INITIAL_FORMS": 0}  # the admin page's placements inline


def bearer(secret: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


@pytest.fixture
def tenants(make_tenant, make_model, adapter_root):
    make_model()
    acme, acme_key = make_tenant("Acme")
    other, other_key = make_tenant("Other")
    (adapter_root / "acme" / "sql").mkdir(parents=True)
    (adapter_root / "other").mkdir()
    return {"acme": acme_key.secret, "other": other_key.secret, "acme_tenant": acme, "other_tenant": other}


def register(client, key: str, source: str, name: str = "mine"):
    return client.post("/api/v1/adapters/", {"name": name, "base_model": MODEL, "source": source},
                       content_type="application/json", **bearer(key))


def test_a_tenant_cannot_register_another_tenants_adapter_path(client, tenants, adapter_root):
    made = register(client, tenants["acme"], "sql")
    assert made.status_code == 201 and made.json()["source"] == str(adapter_root / "acme" / "sql")
    stolen = register(client, tenants["other"], str(adapter_root / "acme" / "sql"))
    assert stolen.status_code == 400 and stolen.json()["code"] == "invalid_adapter_source"
    # The same answer for a path that does not exist: the API cannot probe the store.
    missing = register(client, tenants["other"], str(adapter_root / "acme" / "nothing-here"))
    assert missing.status_code == 400 and missing.json() == stolen.json()
    outside = register(client, tenants["other"], "/etc/passwd")
    assert outside.status_code == 400 and outside.json() == stolen.json()
    assert "acme" not in stolen.json()["detail"] and str(adapter_root) not in stolen.json()["detail"]
    assert Adapter.objects.filter(tenant=tenants["other_tenant"]).count() == 0


@pytest.mark.parametrize("source", ["../acme/sql", "x/../../acme/sql", "{root}/other/../acme/sql", "..", ".",
                                    "link-to-acme/sql", "link-to-etc", "file://{root}/acme/sql", "~/x"])
def test_dot_dot_and_symlink_escapes_are_refused(client, tenants, adapter_root, source):
    (adapter_root / "other" / "link-to-acme").symlink_to(adapter_root / "acme")
    (adapter_root / "other" / "link-to-etc").symlink_to("/etc")
    answer = register(client, tenants["other"], source.format(root=adapter_root))
    assert answer.status_code == 400, answer.json()
    assert answer.json()["code"] in ("invalid_adapter_source", "invalid_value")


def test_object_store_sources_only_under_the_allowed_prefixes_and_the_tenants_folder(client, tenants, settings):
    settings.TESSERA_ADAPTER_SOURCES = "s3://tessera-adapters/store, gs://other-bucket"
    ok = register(client, tenants["other"], "s3://tessera-adapters/store/other/v2")
    assert ok.status_code == 201 and ok.json()["source"] == "s3://tessera-adapters/store/other/v2"
    for source in ("s3://tessera-adapters/store/acme/v2", "s3://tessera-adapters/store/other/../acme/v2",
                   "s3://tessera-adapters/other/v2", "s3://evil/store/other/v2", "s3://tessera-adapters/store/other",
                   "s3://tessera-adapters/store/other/%2e%2e/acme", "gs://other-bucket/acme/x", "s3://tessera-adapters/store/other//x"):
        assert register(client, tenants["other"], source, name="x").status_code == 400, source
    assert register(client, tenants["acme"], "gs://other-bucket/acme/x", name="x").status_code == 201


def test_without_a_configured_store_no_local_source_is_accepted(client, tenants, settings):
    settings.TESSERA_ADAPTER_ROOT = ""
    assert register(client, tenants["acme"], "sql").status_code == 400


def test_the_admin_refuses_a_source_outside_the_tenants_store(admin_client, tenants, adapter_root):
    from controlplane.deployments.models import Model

    page = admin_client.post("/admin/deployments/adapter/add/", {
        "tenant": tenants["other_tenant"].pk, "name": "stolen", "base_model": Model.objects.get().pk,
        "source": str(adapter_root / "acme" / "sql"), "rank": 8, **INLINE})
    assert page.status_code == 200 and b"inside your adapter store" in page.content
    assert not Adapter.objects.filter(name="stolen").exists()
    page = admin_client.post("/admin/deployments/adapter/add/", {
        "tenant": tenants["acme_tenant"].pk, "name": "fine", "base_model": Model.objects.get().pk,
        "source": "sql", "rank": 8, **INLINE})
    assert page.status_code == 302
    assert Adapter.objects.get(name="fine").source == str(adapter_root / "acme" / "sql")


def test_adapters_per_tenant_are_capped(client, tenants, settings):
    settings.TESSERA_MAX_ADAPTERS_PER_TENANT = 2
    assert register(client, tenants["acme"], "a", name="a").status_code == 201
    assert register(client, tenants["acme"], "b", name="b").status_code == 201
    third = register(client, tenants["acme"], "c", name="c")
    assert third.status_code == 409 and third.json()["code"] == "adapter_limit_reached"
    assert register(client, tenants["other"], "a", name="a").status_code == 201  # others keep their own slots
    assert client.delete(f"/api/v1/adapters/{Adapter.objects.get(name='a', tenant=tenants['acme_tenant']).pk}/",
                         **bearer(tenants["acme"])).status_code == 202
    assert register(client, tenants["acme"], "c", name="c").status_code == 201


def test_the_tenant_sees_a_generic_reason_and_operators_the_workers_own(client, admin_client, tenants, adapter_root,
                                                                          make_worker, tmp_path):
    """The worker refuses a source (here: its own root differs) and reports; the tenant's view names no path."""
    worker = make_worker("w1")
    services.deployment_create(model=services.model_create(name="base2"), replicas=1, max_adapters=2)
    reconciler.reconcile()
    replica = Replica.objects.get()
    services.replica_report(worker=worker, replica_id=replica.pk, attempt=1, status="ready")
    adapter_id = register(client, tenants["acme"], "sql").json()["id"]
    Adapter.objects.filter(pk=adapter_id).update(base_model=replica.deployment.model)
    reconciler.reconcile()
    placement = AdapterPlacement.objects.get()

    # What the worker's agent reports: its own root is elsewhere, so the source is outside it.
    slot = EngineSlot(WorkerState(WorkerConfig(model="unassigned")), adapter_root=str(tmp_path / "worker-root"))
    with pytest.raises(LoadError) as refused:
        slot.resolve_adapter_source(str(adapter_root / "acme" / "sql"), "acme")
    error = refused.value
    assert error.permanent and error.kind == "not_found" and str(adapter_root) in error.reason
    services.placement_report(worker=worker, placement_id=placement.pk, attempt=placement.attempt, status="failed",
                              reason=error.reason, permanent=True, kind=error.kind)

    seen = client.get(f"/api/v1/adapters/{adapter_id}/", **bearer(tenants["acme"])).json()
    assert seen["status"] == "failed"
    assert seen["reason"] == "the adapter could not be loaded: not found in your adapter store"
    listed = client.get("/api/v1/adapters/", **bearer(tenants["acme"])).json()["results"][0]
    assert listed["reason"] == seen["reason"]
    assert str(tmp_path) not in str(seen) or seen["source"].startswith(str(adapter_root))  # only its own source
    assert "worker-root" not in str(seen) and "refused" not in str(seen)
    adapter = Adapter.objects.get(pk=adapter_id)
    assert "worker-root" in adapter.reason_detail  # operators keep the worker's words
    page = admin_client.get(f"/admin/deployments/adapter/{adapter_id}/change/")
    assert page.status_code == 200 and b"worker-root" in page.content
    slug = tenants["acme_tenant"].slug
    assert "worker-root" in admin_client.get(f"/api/v1/tenants/{slug}/adapters/{adapter_id}/").json()["reason_detail"]
    assert "reason_detail" not in seen


def test_invalid_peft_files_are_reported_as_such(make_tenant, make_model, make_worker, adapter_root):
    tenant, _ = make_tenant("Acme")
    worker = make_worker("w1")
    model = make_model()
    services.deployment_create(model=model, replicas=1, max_adapters=1)
    reconciler.reconcile()
    replica = Replica.objects.get()
    services.replica_report(worker=worker, replica_id=replica.pk, attempt=1, status="ready")
    adapter = services.adapter_create(tenant=tenant, name="sql", base_model=model, source="sql")
    reconciler.reconcile()
    placement = AdapterPlacement.objects.get()
    services.placement_report(worker=worker, placement_id=placement.pk, attempt=placement.attempt, status="failed",
                              reason=f"adapter 'acme:sql': adapter_config.json is missing from {adapter.source}",
                              permanent=True, kind="invalid")
    adapter.refresh_from_db()
    assert adapter.reason == "the adapter could not be loaded: invalid PEFT files"
    assert adapter.source in adapter.reason_detail
