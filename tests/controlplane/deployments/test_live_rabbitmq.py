"""The same dispatch over RabbitMQ: a failing load through a real broker and a real managed worker
(no weights are loaded: the source is refused before any engine is built)."""

from __future__ import annotations

import os
import time

import pytest

from .live import Stack, operator_client, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq, pytest.mark.django_db(transaction=True)]

BROKER = os.environ.get("TESSERA_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@pytest.fixture
def stack(django_db_setup, transactional_db):
    stack = Stack(BROKER)
    try:
        name = stack.add_worker("amqp")
        stack.wait_ready()
        from controlplane.deployments.models import Worker

        wait_for(lambda: Worker.objects.filter(name=name, status="ready").exists(), 60, "the worker", stack)
        yield stack
    finally:
        stack.stop()


def test_a_failing_load_over_rabbitmq_is_reported_once_and_retried_only_on_request(stack):
    from controlplane.deployments.models import Replica, Worker

    api = operator_client(stack)
    assert api.post("/models/", json={"name": "missing", "source": "/nonexistent/missing.gguf"}).status_code == 201
    assert api.post("/deployments/", json={"model": "missing", "replicas": 1}).status_code == 201
    replicas = Replica.objects.filter(deployment__name="missing")
    failed = wait_for(lambda: (r := replicas.first()) and r.status == "failed" and r, 30, "the failure", stack)
    assert "cannot be loaded here" in failed.reason and failed.retry_at is None
    time.sleep(3)
    assert replicas.get().attempt == 1
    worker = Worker.objects.get(name=next(iter(stack.workers)))
    assert worker.stats["tasks"] == {"load_model": 1} and worker.stats["engine_builds"] == 0

    retried = api.post(f"/deployments/missing/replicas/{failed.pk}/retry/")
    assert retried.status_code == 200 and retried.json()["status"] == "pending"
    again = wait_for(lambda: (r := replicas.get()) and r.attempt == 2 and r.status == "failed" and r, 30,
                     "the operator's retry", stack)
    assert again.failures == 1
    wait_for(lambda: Worker.objects.get(pk=worker.pk).stats["tasks"] == {"load_model": 2}, 10, "the second message",
             stack)
    api.close()
