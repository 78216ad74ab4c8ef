"""The reconciler and the reports it reacts to, with task messages recorded instead of sent."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from controlplane.deployments import reconciler, services
from controlplane.deployments.dispatch import LOAD_ADAPTER, LOAD_MODEL, UNLOAD_ADAPTER, UNLOAD_MODEL
from controlplane.deployments.models import Adapter, AdapterPlacement, Deployment, Replica, Worker

pytestmark = pytest.mark.django_db


def reconcile(commit, now=None):
    with commit():
        return reconciler.reconcile(now=now)


def report(commit, replica, status, **fields):
    replica.refresh_from_db()
    with commit():
        return services.replica_report(worker=replica.worker, replica_id=replica.pk, attempt=replica.attempt,
                                       status=status, **fields)


def test_places_replicas_on_free_workers_matching_the_placement_and_is_idempotent(
        sent, commit, make_worker, make_model):
    make_worker("cpu-0")
    gpu = make_worker("gpu-0", accelerator="NVIDIA H100 80GB HBM3", labels={"zone": "a"})
    services.deployment_create(model=make_model(), replicas=1, placement={"accelerator": "h100", "labels": {"zone": "a"}})
    reconcile(commit)
    replica = Replica.objects.get()
    assert (replica.worker, replica.status, replica.attempt) == (gpu, "loading", 1)
    assert sent.of(LOAD_MODEL) == [(LOAD_MODEL, [replica.pk, 1], "worker.gpu-0")]
    reconcile(commit)
    assert len(sent.of(LOAD_MODEL)) == 1 and Replica.objects.count() == 1


def test_no_matching_worker_leaves_the_replica_pending_with_a_reason(sent, commit, make_worker, make_model):
    make_worker("cpu-0")
    services.deployment_create(model=make_model(), replicas=1, placement={"min_memory_gib": 80})
    reconcile(commit)
    replica = Replica.objects.get()
    assert replica.status == "pending" and "placement" in replica.reason and not sent.of(LOAD_MODEL)


def test_scale_up_then_down_stops_the_newest_and_removes_it_once_unloaded(sent, commit, make_worker, make_model):
    make_worker("w1"), make_worker("w2")
    deployment = services.deployment_create(model=make_model(), replicas=2)
    reconcile(commit)
    first, second = Replica.objects.order_by("id")
    for replica in (first, second):
        assert report(commit, replica, "ready")["applied"]
    with commit():
        services.deployment_update(deployment=deployment, replicas=1)
    reconcile(commit)
    second.refresh_from_db()
    assert second.status == "stopping" and sent.of(UNLOAD_MODEL) == [(UNLOAD_MODEL, [second.pk, 1], second.worker.queue)]
    assert report(commit, second, "stopped") == {"applied": True, "status": "gone"}
    assert list(Replica.objects.values_list("pk", flat=True)) == [first.pk]


def test_a_dead_worker_s_replica_moves_to_another_worker(sent, commit, make_worker, make_model):
    w1 = make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1, placement={"workers": ["w1"]})
    reconcile(commit)
    replica = Replica.objects.get()
    report(commit, replica, "ready")
    w2 = make_worker("w2")
    with commit():
        services.deployment_update(deployment=replica.deployment, placement={})
    Worker.objects.filter(pk=w1.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=60))
    result = reconcile(commit)
    replica.refresh_from_db()
    assert result.dead_workers == ["w1"] and Worker.objects.get(pk=w1.pk).status == "dead"
    assert (replica.worker, replica.status, replica.attempt) == (w2, "loading", 2)
    assert sent.of(LOAD_MODEL)[-1] == (LOAD_MODEL, [replica.pk, 2], "worker.w2")


def test_a_failing_load_backs_off_then_stays_failed_without_a_retry_storm(sent, commit, make_worker, make_model,
                                                                         settings):
    settings.TESSERA_REPLICA_MAX_ATTEMPTS = 2
    settings.TESSERA_REPLICA_RETRY_SECONDS = 10
    make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1)
    reconcile(commit)
    replica = Replica.objects.get()
    report(commit, replica, "failed", reason="CUDA out of memory")
    replica.refresh_from_db()
    assert replica.status == "failed" and replica.worker is None and replica.retry_at is not None
    assert "attempt 1 of 2" in replica.reason
    reconcile(commit)  # before the backoff ends: nothing happens
    assert len(sent.of(LOAD_MODEL)) == 1
    reconcile(commit, now=timezone.now() + dt.timedelta(seconds=11))
    replica.refresh_from_db()
    assert (replica.status, replica.attempt, len(sent.of(LOAD_MODEL))) == ("loading", 2, 2)
    report(commit, replica, "failed", reason="CUDA out of memory")
    replica.refresh_from_db()
    assert replica.status == "failed" and replica.retry_at is None and "gave up after 2 attempts" in replica.reason
    for minutes in (1, 10, 100):
        reconcile(commit, now=timezone.now() + dt.timedelta(minutes=minutes))
    assert len(sent.of(LOAD_MODEL)) == 2 and Replica.objects.count() == 1


def test_a_permanent_failure_is_not_retried_until_an_operator_retries(sent, commit, make_worker, make_model):
    make_worker("w1")
    services.deployment_create(model=make_model(source="/nope/model.gguf"), replicas=1)
    reconcile(commit)
    replica = Replica.objects.get()
    report(commit, replica, "failed", reason="model source '/nope/model.gguf' cannot be loaded here", permanent=True)
    replica.refresh_from_db()
    assert replica.status == "failed" and replica.retry_at is None and "not retried" in replica.reason
    reconcile(commit, now=timezone.now() + dt.timedelta(hours=1))  # (also finds w1 dead: an hour without news)
    assert len(sent.of(LOAD_MODEL)) == 1
    make_worker("w1")  # back
    with commit():
        services.replica_retry(replica=replica)
    reconcile(commit)
    replica.refresh_from_db()
    assert replica.status == "loading" and replica.failures == 0 and len(sent.of(LOAD_MODEL)) == 2


def test_stale_reports_change_nothing(sent, commit, make_worker, make_model):
    make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1)
    reconcile(commit)
    replica = Replica.objects.get()
    with commit():
        answer = services.replica_report(worker=replica.worker, replica_id=replica.pk, attempt=replica.attempt + 5,
                                         status="ready")
    assert answer == {"applied": False, "status": "loading"}
    other = make_worker("w2")
    with commit():
        answer = services.replica_report(worker=other, replica_id=replica.pk, attempt=replica.attempt, status="ready")
    assert answer["applied"] is False and Replica.objects.get().status == "loading"


def test_drain_replaces_before_it_stops(sent, commit, make_worker, make_model):
    w1 = make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1)
    reconcile(commit)
    old = Replica.objects.get()
    report(commit, old, "ready")
    make_worker("w2")
    with commit():
        services.worker_cordon(worker=w1)
    reconcile(commit)
    new = Replica.objects.exclude(pk=old.pk).get()
    old.refresh_from_db()
    assert new.status == "loading" and new.worker.name == "w2" and old.status == "ready"
    report(commit, new, "ready")
    reconcile(commit)
    old.refresh_from_db()
    assert old.status == "stopping" and sent.of(UNLOAD_MODEL)[-1][2] == "worker.w1"


def test_a_load_the_worker_never_started_is_sent_again_then_fails(sent, commit, make_worker, make_model, settings):
    settings.TESSERA_REPLICA_REDISPATCH_SECONDS = 30
    settings.TESSERA_WORKER_DEAD_SECONDS = 3600  # the worker heartbeats on (its slot stays idle)
    make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1)
    reconcile(commit)
    replica = Replica.objects.get()
    base = replica.dispatched_at
    for n in range(1, 4):
        reconcile(commit, now=base + dt.timedelta(seconds=31 * n))
        assert len(sent.of(LOAD_MODEL)) == 1 + n and sent.of(LOAD_MODEL)[-1][1] == [replica.pk, 1]  # same attempt
    reconcile(commit, now=base + dt.timedelta(seconds=31 * 4))
    replica.refresh_from_db()
    assert replica.status == "failed" and "never started" in replica.reason


def test_the_heartbeat_recovers_a_lost_ready_report_and_a_restart_releases_replicas(sent, commit, make_worker,
                                                                                     make_model):
    worker = make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1)
    reconcile(commit)
    replica = Replica.objects.get()
    with commit():
        services.worker_heartbeat(worker=worker, boot_id="boot-1", status="ready",
                                  slot={"state": "ready", "replica_uid": str(replica.uid), "attempt": 1,
                                        "served_name": "smollm2-135m-instruct", "load_seconds": 3.5})
    replica.refresh_from_db()
    worker.refresh_from_db()
    assert replica.status == "ready" and replica.load_seconds == 3.5 and worker.loaded_model == "smollm2-135m-instruct"
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=16))
    with commit():  # the old boot's registration expired: the restarted process takes its name back
        services.worker_register(name="w1", url=worker.url, boot_id="boot-2", status="ready")
    replica.refresh_from_db()
    assert replica.status == "pending" and replica.worker is None and "restarted" in replica.reason


def test_deleting_a_deployment_unloads_then_removes_it(sent, commit, make_worker, make_model):
    make_worker("w1")
    deployment = services.deployment_create(model=make_model(), replicas=1)
    reconcile(commit)
    replica = Replica.objects.get()
    report(commit, replica, "ready")
    with commit():
        services.deployment_delete(deployment=deployment)
    reconcile(commit)
    report(commit, replica, "stopped")
    reconcile(commit)
    assert not Deployment.objects.exists()


def test_adapters_follow_ready_replicas_with_slots_and_are_unloaded_before_removal(sent, commit, make_worker,
                                                                                  make_model, make_tenant):
    make_worker("w1")
    model = make_model()
    services.deployment_create(model=model, replicas=1, max_adapters=2)
    tenant, _ = make_tenant("Acme")
    adapter = services.adapter_create(tenant=tenant, name="sql", base_model=model, source="sql")
    assert adapter.served_name == "acme:sql"
    reconcile(commit)
    assert not sent.of(LOAD_ADAPTER)  # the replica is not ready yet
    replica = Replica.objects.get()
    report(commit, replica, "ready")
    reconcile(commit)
    placement = AdapterPlacement.objects.get()
    assert sent.of(LOAD_ADAPTER) == [(LOAD_ADAPTER, [placement.pk, 1], "worker.w1")]
    with commit():
        services.placement_report(worker=replica.worker, placement_id=placement.pk, attempt=1, status="ready")
    assert Adapter.objects.get().status == "ready"
    with commit():
        services.adapter_delete(adapter=adapter)
    reconcile(commit)
    assert sent.of(UNLOAD_ADAPTER) == [(UNLOAD_ADAPTER, [placement.pk, 1], "worker.w1")]
    with commit():
        services.placement_report(worker=replica.worker, placement_id=placement.pk, attempt=1, status="stopped")
    assert not Adapter.objects.exists()
