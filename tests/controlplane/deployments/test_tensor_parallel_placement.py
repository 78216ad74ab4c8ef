"""A tensor-parallel deployment (engine_args.tensor_parallel_size) lands only where its ranks fit."""

from __future__ import annotations

import pytest

from common.errors import ApplicationError
from controlplane.deployments import reconciler, selectors, services
from controlplane.deployments.dispatch import LOAD_MODEL
from controlplane.deployments.models import Replica, Worker

pytestmark = pytest.mark.django_db


def reconcile(commit):
    with commit():
        return reconciler.reconcile()


def test_a_tp3_replica_skips_workers_with_fewer_devices(sent, commit, make_worker, make_model):
    make_worker("a-one-device")  # first in name order, free, matches the placement: too small all the same
    make_worker("b-two-devices", device_count=2)
    services.deployment_create(model=make_model(), replicas=1, engine_args={"tensor_parallel_size": 3})
    reconcile(commit)
    replica = Replica.objects.get()
    assert replica.status == "pending" and not sent.of(LOAD_MODEL)
    assert replica.reason.endswith("and has 3 devices (tensor_parallel_size 3)")

    big = make_worker("c-three-ranks", device_count=3)  # e.g. a CPU worker with TESSERA_WORKER_DEVICES=3
    reconcile(commit)
    replica.refresh_from_db()
    assert (replica.worker, replica.status) == (big, "loading")
    assert sent.of(LOAD_MODEL) == [(LOAD_MODEL, [replica.pk, 1], "worker.c-three-ranks")]
    # The worker builds its engine from the spec: the ranks travel in engine_args.
    assert selectors.replica_spec(worker=big, replica_id=replica.pk)["engine_args"]["tensor_parallel_size"] == 3


def test_one_device_deployments_still_take_any_worker(sent, commit, make_worker, make_model):
    make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1, engine_args={"tensor_parallel_size": 1})
    reconcile(commit)
    assert Replica.objects.get().status == "loading"


@pytest.mark.parametrize("value", [0, -1, "3", 2.0, True])
def test_engine_args_refuse_a_tensor_parallel_size_that_is_not_a_positive_integer(make_model, value):
    with pytest.raises(ApplicationError, match="tensor_parallel_size: an integer from 1"):
        services.deployment_create(model=make_model(), replicas=1, engine_args={"tensor_parallel_size": value})


def test_registration_records_the_device_count(make_worker):
    make_worker("gpu-box", device_count=8)
    assert Worker.objects.get(name="gpu-box").device_count == 8


def test_the_internal_api_takes_the_advertised_device_count(client, settings):
    settings.TESSERA_INTERNAL_TOKEN = "worker-secret"
    body = {"name": "w3", "url": "http://w3:8100", "boot_id": "b1", "accelerator": "cpu", "device_count": 3,
            "status": "ready"}
    answer = client.post("/internal/v1/workers/register", body, content_type="application/json",
                         HTTP_AUTHORIZATION="Bearer worker-secret")
    assert answer.status_code == 200 and Worker.objects.get(name="w3").device_count == 3
    body.update(name="w0", url="http://w0:8100", device_count=0)
    assert client.post("/internal/v1/workers/register", body, content_type="application/json",
                       HTTP_AUTHORIZATION="Bearer worker-secret").status_code == 400
