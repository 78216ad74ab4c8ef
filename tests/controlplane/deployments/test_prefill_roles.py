"""A deployment's prefill replicas (disaggregated serving): declared with a count, placed by the reconciler
on workers of their own, never routed to by the gateway, and named to the serving replicas' requests."""

from __future__ import annotations

import pytest

from common.errors import ApplicationError
from controlplane.deployments import reconciler, selectors, services
from controlplane.deployments.models import Replica

pytestmark = pytest.mark.django_db
ARGS = {"kv_offload_size": "1GiB"}


def reconcile(commit):
    with commit():
        return reconciler.reconcile()


def ready_all(commit) -> None:
    for replica in Replica.objects.filter(status="loading"):
        with commit():
            services.replica_report(worker=replica.worker, replica_id=replica.pk, attempt=replica.attempt,
                                    status="ready")


@pytest.mark.parametrize("value", [-1, 65, True, "2"])
def test_a_bad_count_is_refused(make_model, value):
    with pytest.raises(ApplicationError, match="prefill_replicas") as refused:
        services.deployment_create(model=make_model(), engine_args=ARGS, prefill_replicas=value)
    assert refused.value.param == "prefill_replicas"


def test_prefill_replicas_need_a_second_tier_on_the_serving_ones(make_model):
    model = make_model()
    with pytest.raises(ApplicationError, match="kv_offload_size"):
        services.deployment_create(model=model, prefill_replicas=1)
    d = services.deployment_create(model=model, engine_args=ARGS, prefill_replicas=1)
    with pytest.raises(ApplicationError, match="kv_offload_size"):  # taking the tier away later
        services.deployment_update(deployment=d, engine_args={})
    assert services.deployment_update(deployment=d, prefill_replicas=0, engine_args={}).prefill_replicas == 0


def test_the_reconciler_places_each_role_on_its_own_workers(make_model, make_worker, sent, commit):
    workers = [make_worker(f"w{i}") for i in range(4)]
    d = services.deployment_create(model=make_model(), replicas=2, engine_args=ARGS, prefill_replicas=1)
    reconcile(commit)
    replicas = list(Replica.objects.filter(deployment=d))
    assert sorted(r.role for r in replicas) == ["prefill", "serve", "serve"]
    assert len({r.worker_id for r in replicas}) == 3 and all(r.status == "loading" for r in replicas)
    ready_all(commit)
    # The gateway routes clients to the serving replicas only, each naming the prefill replica.
    prefill_url = Replica.objects.get(deployment=d, role="prefill").worker.url.rstrip("/")
    routes = selectors.routing_table()
    serving = {r.worker.url.rstrip("/") for r in Replica.objects.filter(deployment=d, role="serve")}
    assert {r.url for r in routes} == serving
    assert {r.prefill_url for r in routes} == {prefill_url}
    # Scaling the prefill side: more, then none; the serving side is left as it is.
    services.deployment_update(deployment=d, prefill_replicas=2)
    reconcile(commit)
    assert Replica.objects.filter(deployment=d, role="prefill").exclude(status="stopping").count() == 2
    ready_all(commit)
    assert {r.prefill_url for r in selectors.routing_table()} == {
        r.worker.url.rstrip("/") for r in Replica.objects.filter(deployment=d, role="prefill")}
    services.deployment_update(deployment=d, prefill_replicas=0)
    reconcile(commit)
    assert not Replica.objects.filter(deployment=d, role="prefill").exclude(status="stopping").exists()
    assert Replica.objects.filter(deployment=d, role="serve", status="ready").count() == 2
    assert {r.prefill_url for r in selectors.routing_table()} == {None}
    assert len(workers) == 4


def test_the_api_takes_and_shows_the_count(client, operator, make_model):
    client.force_login(operator)
    make_model()
    bad = client.post("/api/v1/deployments/", {"model": "smollm2-135m-instruct", "prefill_replicas": 1},
                      content_type="application/json")
    assert bad.status_code == 400 and "kv_offload_size" in bad.json()["detail"]
    good = client.post("/api/v1/deployments/", {"model": "smollm2-135m-instruct", "prefill_replicas": 1,
                                                "engine_args": ARGS}, content_type="application/json")
    assert good.status_code == 201 and good.json()["prefill_replicas"] == 1


def test_the_admin_form_checks_the_second_tier(admin_client, make_model):
    model = make_model()
    form = {"name": "x", "model": model.pk, "quantization": "bf16", "desired_replicas": 1, "served_name": "",
            "placement": "{}", "engine_args": "{}", "max_adapters": 0, "prefill_replicas": 1,
            "replicas-TOTAL_FORMS": 0, "replicas-INITIAL_FORMS": 0}
    page = admin_client.post("/admin/deployments/deployment/add/", form)
    assert page.status_code == 200 and "kv_offload_size" in page.content.decode()
    created = admin_client.post("/admin/deployments/deployment/add/",
                                {**form, "engine_args": '{"kv_offload_size": "1GiB"}'})
    assert created.status_code == 302
    from controlplane.deployments.models import Deployment

    assert Deployment.objects.get().prefill_replicas == 1
