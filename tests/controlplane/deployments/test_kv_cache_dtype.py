"""A deployment's engine_args.kv_cache_dtype: validated by the control plane, carried to the worker in its spec."""

from __future__ import annotations

import pytest

from common.errors import ApplicationError
from controlplane.deployments import selectors, services

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value", ["fp16", "FP8", "float8_e4m3fn", "", None, 8])
def test_engine_args_refuse_an_unknown_kv_cache_dtype(make_model, value):
    with pytest.raises(ApplicationError, match="engine_args.kv_cache_dtype: one of") as refused:
        services.deployment_create(model=make_model(), replicas=1, engine_args={"kv_cache_dtype": value})
    assert refused.value.param == "engine_args"


def test_an_fp8_cache_travels_to_the_worker_in_the_spec(make_model, make_worker, sent, commit):
    from controlplane.deployments import reconciler
    from controlplane.deployments.models import Replica

    worker = make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1, engine_args={"kv_cache_dtype": "fp8"})
    with commit():
        reconciler.reconcile()
    replica = Replica.objects.get()
    assert selectors.replica_spec(worker=worker, replica_id=replica.pk)["engine_args"] == {"kv_cache_dtype": "fp8"}


def test_the_api_answers_a_bad_kv_cache_dtype_with_a_400(client, operator, make_model):
    client.force_login(operator)
    make_model()
    bad = client.post("/api/v1/deployments/", {"model": "smollm2-135m-instruct", "engine_args": {"kv_cache_dtype": "int4"}},
                      content_type="application/json")
    assert bad.status_code == 400 and "kv_cache_dtype" in bad.json()["detail"]
    good = client.post("/api/v1/deployments/", {"model": "smollm2-135m-instruct", "engine_args": {"kv_cache_dtype": "fp8"}},
                       content_type="application/json")
    assert good.status_code == 201


@pytest.mark.parametrize("value", ["lots", "-1GiB", "0GiB", "1TiB", True, -1, 1.5, "8GiB\x00", None])
def test_engine_args_refuse_a_bad_kv_offload_size(make_model, value):
    with pytest.raises(ApplicationError, match="engine_args") as refused:
        services.deployment_create(model=make_model(), replicas=1, engine_args={"kv_offload_size": value})
    assert refused.value.param == "engine_args"


@pytest.mark.parametrize("value", ["8GiB", "512mb", 0, "0", 1 << 30])
def test_a_kv_offload_size_travels_to_the_worker_in_the_spec(make_model, make_worker, commit, value):
    """The worker hands it to the engine's CacheConfig (dataplane/worker/agent/slot.py, CACHE_CONFIG)."""
    from controlplane.deployments import reconciler
    from controlplane.deployments.models import Replica

    worker = make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1, engine_args={"kv_offload_size": value})
    with commit():
        reconciler.reconcile()
    spec = selectors.replica_spec(worker=worker, replica_id=Replica.objects.get().pk)
    assert spec["engine_args"] == {"kv_offload_size": value}
