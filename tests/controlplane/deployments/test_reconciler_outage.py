"""The reconciler after the control plane was away (passes stopped: database, broker or beat down), and
loads whose messages were lost, with task messages recorded instead of sent. The same behaviour
against real processes: test_database_outage.py and test_broker_outage.py."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.deployments import reconciler, services
from controlplane.deployments.dispatch import LOAD_ADAPTER, LOAD_MODEL
from controlplane.deployments.models import AdapterPlacement, ReconcilerState, Replica, Worker
from controlplane.deployments.outage_log import OutageLog

pytestmark = pytest.mark.django_db


def reconcile(commit, now=None):
    with commit():
        return reconciler.reconcile(now=now)


def ready_replica(commit, make_worker, make_model, **deployment):
    worker = make_worker("w1")
    services.deployment_create(model=make_model(), replicas=1, **deployment)
    reconcile(commit)
    replica = Replica.objects.get()
    with commit():
        services.replica_report(worker=worker, replica_id=replica.pk, attempt=1, status="ready")
    return worker, replica


def test_after_a_gap_no_worker_is_declared_dead_until_it_has_had_a_full_heartbeat_window(
        sent, commit, make_worker, make_model, settings):
    settings.TESSERA_RECONCILE_SECONDS, settings.TESSERA_WORKER_DEAD_SECONDS = 5, 15
    worker, replica = ready_replica(commit, make_worker, make_model)
    t0 = timezone.now()
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=t0)
    # The database was down for 60 s: no passes, no heartbeats recorded. The first pass after it:
    back = t0 + dt.timedelta(seconds=60)
    result = reconcile(commit, now=back)
    assert result.resumed and result.dead_workers == []
    assert ReconcilerState.objects.get().resumed_at == back
    result = reconcile(commit, now=back + dt.timedelta(seconds=4))
    assert not result.resumed and result.dead_workers == []
    replica.refresh_from_db()
    assert (replica.status, replica.attempt, replica.worker_id) == ("ready", 1, worker.pk)
    # A worker that stays silent for a whole window after the control plane came back is dead.
    for seconds in range(8, 20, 4):
        result = reconcile(commit, now=back + dt.timedelta(seconds=seconds))
    assert result.dead_workers == ["w1"] and Worker.objects.get(pk=worker.pk).status == "dead"


def test_without_a_gap_a_silent_worker_is_dead_after_the_usual_window(sent, commit, make_worker, make_model,
                                                                     settings):
    settings.TESSERA_RECONCILE_SECONDS, settings.TESSERA_WORKER_DEAD_SECONDS = 5, 15
    worker, _ = ready_replica(commit, make_worker, make_model)
    t0 = timezone.now()
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=t0)
    for seconds in range(0, 20, 4):  # passes every 4 s: the control plane was up throughout
        result = reconcile(commit, now=t0 + dt.timedelta(seconds=seconds))
        assert not result.resumed
    assert result.dead_workers == ["w1"]


def test_after_a_gap_unconfirmed_loads_are_sent_again_at_once_with_the_same_attempt(
        sent, commit, make_worker, make_model, make_tenant, settings):
    settings.TESSERA_RECONCILE_SECONDS, settings.TESSERA_REPLICA_REDISPATCH_SECONDS = 5, 30
    make_worker("w2")  # its load of a second deployment's replica was sent just before the broker died
    worker, replica = ready_replica(commit, make_worker, make_model, max_adapters=1)
    tenant, _ = make_tenant("Acme")
    services.adapter_create(tenant=tenant, name="sql", base_model=replica.deployment.model, source="sql")
    services.deployment_create(model=make_model("other"), replicas=1, placement={"workers": ["w2"]})
    reconcile(commit)
    placement = AdapterPlacement.objects.get()
    other = Replica.objects.get(deployment__name="other")
    assert other.status == "loading" and placement.status == "loading"
    before = len(sent)
    Worker.objects.update(last_heartbeat_at=timezone.now() + dt.timedelta(seconds=20))  # alive through it
    result = reconcile(commit, now=timezone.now() + dt.timedelta(seconds=20))  # the broker was away 20 s
    assert result.resumed and result.redispatched == 2
    assert sorted(sent[before:]) == [(LOAD_ADAPTER, [placement.pk, 1], "worker.w1"),
                                     (LOAD_MODEL, [other.pk, 1], "worker.w2")]
    reconcile(commit, now=timezone.now() + dt.timedelta(seconds=24))  # the next pass: nothing more
    assert len(sent) == before + 2


def test_a_lost_adapter_load_is_sent_again_then_fails_instead_of_waiting_for_the_load_timeout(
        sent, commit, make_worker, make_model, make_tenant, settings):
    settings.TESSERA_REPLICA_REDISPATCH_SECONDS = 30
    settings.TESSERA_RECONCILE_SECONDS = 3600  # no gap: only the redispatch timer acts
    settings.TESSERA_WORKER_DEAD_SECONDS = 3600
    worker, replica = ready_replica(commit, make_worker, make_model, max_adapters=1)
    tenant, _ = make_tenant("Acme")
    services.adapter_create(tenant=tenant, name="sql", base_model=replica.deployment.model, source="sql")
    reconcile(commit)
    placement = AdapterPlacement.objects.get()
    base = placement.dispatched_at
    reconcile(commit, now=base + dt.timedelta(seconds=20))
    assert len(sent.of(LOAD_ADAPTER)) == 1  # not yet
    for n in range(1, 4):
        reconcile(commit, now=base + dt.timedelta(seconds=31 * n))
        assert sent.of(LOAD_ADAPTER)[-1] == (LOAD_ADAPTER, [placement.pk, 1], "worker.w1")
        assert len(sent.of(LOAD_ADAPTER)) == 1 + n
    reconcile(commit, now=base + dt.timedelta(seconds=31 * 5))
    assert len(sent.of(LOAD_ADAPTER)) == 4  # bounded
    with commit():  # the worker had it all along: its report of a resent message settles it
        services.placement_report(worker=worker, placement_id=placement.pk, attempt=1, status="ready")
    assert AdapterPlacement.objects.get().status == "ready"


def test_the_outage_log_says_it_once_then_once_a_minute_then_that_it_ended(caplog):
    clock = [1000.0]
    outage = OutageLog(logging.getLogger("tessera.test"), "the thing", clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="tessera.test"):
        outage.succeeded()
        for _ in range(300):  # five minutes of a failure a second
            outage.failed(ConnectionError("refused"))
            clock[0] += 1
        outage.succeeded()
        outage.succeeded()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["the thing unavailable"] + ["the thing still unavailable"] * 4 + ["the thing available again"]
    assert caplog.records[0].error == "ConnectionError: refused" and caplog.records[-1].failures == 300


def test_metrics_show_how_long_ago_the_reconciler_last_completed_a_pass(sent, commit, client):
    assert b"tessera_reconciler_last_pass_age_seconds" not in client.get("/metrics").content  # no pass yet
    reconcile(commit, now=timezone.now() - dt.timedelta(seconds=90))
    reconcile(commit, now=timezone.now() - dt.timedelta(seconds=30))  # after a 60 s gap
    lines = client.get("/metrics").content.decode().splitlines()
    age = next(float(line.split()[1]) for line in lines if line.startswith("tessera_reconciler_last_pass_age_seconds"))
    assert 30 <= age < 40
    resumed = next(float(line.split()[1]) for line in lines
                   if line.startswith("tessera_reconciler_last_resume_timestamp_seconds"))
    assert abs(resumed - (timezone.now().timestamp() - 30)) < 10
    # The alert reads the series /metrics serves.
    import yaml

    rules = yaml.safe_load(Path("deploy/prometheus/tessera-deploy-rules.yml").read_text())["groups"][0]["rules"]
    assert all("tessera_reconciler_last_pass_age_seconds" in rule["expr"] for rule in rules)
