"""The reconciler applying the autoscaler: decisions audited, replicas drained before they are
unloaded, silent workers, scale to zero; messages recorded instead of sent (real database)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from controlplane.audit.models import AuditEvent
from controlplane.deployments import reconciler, selectors, services
from controlplane.deployments.dispatch import LOAD_MODEL, UNLOAD_MODEL
from controlplane.deployments.models import AutoscalerState, Deployment, Replica, Worker

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def beat(worker: Worker, when: dt.datetime, *, running: int = 0, waiting: int = 0, kv: float = 0.05) -> None:
    """A heartbeat's load figures, as the agent sends them (only the figures: the slot is not at stake)."""
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=when, num_running=running, num_waiting=waiting,
                                               kv_cache_usage=kv, status="ready")


def reconcile(commit, when: dt.datetime):
    with commit():
        return reconciler.reconcile(now=when)


def ready_all(commit) -> None:
    for replica in Replica.objects.filter(status="loading"):
        with commit():
            services.replica_report(worker=replica.worker, replica_id=replica.pk, attempt=replica.attempt,
                                    status="ready")


def autoscale_events() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action="deployment.autoscale").order_by("id"))


@pytest.fixture
def fleet(sent, commit, make_worker, make_model, settings):
    settings.TESSERA_RECONCILE_SECONDS = 1000  # passes far apart in these tests are not an outage
    workers = [make_worker(f"w{i}") for i in range(4)]
    deployment = services.deployment_create(model=make_model(), replicas=1, min_replicas=1, max_replicas=3)
    for w in workers:
        beat(w, at(0))
    reconcile(commit, at(0))
    ready_all(commit)
    return deployment, workers


def busy_workers(deployment: Deployment) -> list[Worker]:
    return [r.worker for r in deployment.replicas.select_related("worker").filter(status="ready")]


def test_a_queue_grows_the_deployment_and_the_decision_is_audited_with_its_signals(fleet, sent, commit):
    deployment, workers = fleet
    for w in workers:
        beat(w, at(5))
    (serving,) = busy_workers(deployment)
    beat(serving, at(5), running=8, waiting=12)
    reconcile(commit, at(5))
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 2  # 12 waiting on 1 replica, target 4: 3 wanted, at most double a step
    (event,) = autoscale_events()
    assert event.changes["desired_replicas"] == [1, 2] and event.changes["reason"] == [None, "queue"]
    assert event.changes["signals"][1]["waiting"] == 12 and event.changes["signals"][1]["reporting"] == 1
    assert event.actor_type == "system"
    assert len(sent.of(LOAD_MODEL)) == 1 + 1  # the pass that decided also placed (one free worker matched first)
    state = AutoscalerState.objects.get(deployment=deployment)
    assert (state.ups, state.reason, state.recommended) == (1, "queue", 2)
    beat(serving, at(20), running=8, waiting=12)
    reconcile(commit, at(20))  # still queued, but within the up cooldown (30 s): the new replica is loading
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 2 and AutoscalerState.objects.get().reason == "up_cooldown"


def test_a_manual_deployment_is_never_autoscaled(sent, commit, make_worker, make_model, settings):
    settings.TESSERA_RECONCILE_SECONDS = 1000
    w = make_worker("w0")
    deployment = services.deployment_create(model=make_model(), replicas=1)
    beat(w, at(0))
    reconcile(commit, at(0))
    ready_all(commit)
    beat(w, at(5), waiting=100, kv=0.99)
    reconcile(commit, at(5))
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 1 and not autoscale_events()
    assert not AutoscalerState.objects.exists()


def scaled_to_two(fleet, commit) -> tuple[Deployment, list[Worker]]:
    deployment, workers = fleet
    with commit():
        services.deployment_update(deployment=deployment, replicas=2)
    for w in workers:
        beat(w, at(1))
    reconcile(commit, at(1))
    ready_all(commit)
    deployment.refresh_from_db()
    return deployment, workers


def test_scale_down_drains_first_and_unloads_only_once_the_worker_is_idle(fleet, sent, commit):
    deployment, workers = scaled_to_two(fleet, commit)
    newest = deployment.replicas.order_by("-id").first()
    for w in workers:
        beat(w, at(10))
    reconcile(commit, at(10))  # low: the stability clock starts
    for w in workers:
        beat(w, at(400))
    reconcile(commit, at(400))
    deployment.refresh_from_db()
    newest.refresh_from_db()
    assert deployment.desired_replicas == 1 and newest.status == "ready" and newest.drain_started_at == at(400)
    assert autoscale_events()[-1].changes["reason"] == [None, "low_load"]
    assert newest.worker.url not in {r.url for r in selectors.routing_table(now=at(400))}  # no new requests
    assert not sent.of(UNLOAD_MODEL)
    beat(newest.worker, at(401), running=2)  # a heartbeat from before every gateway polled vouches for nothing
    reconcile(commit, at(401))
    beat(newest.worker, at(404), running=2)  # after, but still serving what it had
    reconcile(commit, at(404))
    newest.refresh_from_db()
    assert newest.status == "ready" and not sent.of(UNLOAD_MODEL)
    beat(newest.worker, at(406))  # idle: now it goes
    reconcile(commit, at(406))
    newest.refresh_from_db()
    assert newest.status == "stopping" and sent.of(UNLOAD_MODEL) == [(UNLOAD_MODEL, [newest.pk, 1], newest.worker.queue)]


def test_a_drain_that_never_empties_is_cut_after_the_drain_timeout(fleet, sent, commit, settings):
    settings.TESSERA_AUTOSCALE_DRAIN_SECONDS = 60
    deployment, workers = scaled_to_two(fleet, commit)
    newest = deployment.replicas.order_by("-id").first()
    for w in workers:
        beat(w, at(10))
    reconcile(commit, at(10))
    for w in workers:
        beat(w, at(400))
    reconcile(commit, at(400))
    # The draining worker stays busy; the kept one is quiet (so the autoscaler does not take the drain back).
    for second in (420, 459):
        beat(newest.worker, at(second), running=3)
        reconcile(commit, at(second))
    assert not sent.of(UNLOAD_MODEL)
    beat(newest.worker, at(461), running=3)
    reconcile(commit, at(461))
    newest.refresh_from_db()
    assert newest.status == "stopping"


def test_load_rising_during_a_drain_takes_the_drain_back_instead_of_loading_anew(fleet, sent, commit):
    deployment, workers = scaled_to_two(fleet, commit)
    newest = deployment.replicas.order_by("-id").first()
    kept = deployment.replicas.order_by("id").first()
    for w in workers:
        beat(w, at(10))
    reconcile(commit, at(10))
    for w in workers:
        beat(w, at(400))
    reconcile(commit, at(400))
    loads = len(sent.of(LOAD_MODEL))
    beat(kept.worker, at(500), running=16, waiting=10)  # load is back on the replica that stayed
    beat(newest.worker, at(500))
    reconcile(commit, at(500))
    newest.refresh_from_db()
    deployment.refresh_from_db()
    assert deployment.desired_replicas >= 2 and newest.drain_started_at is None and newest.status == "ready"
    assert not sent.of(UNLOAD_MODEL)
    assert len(sent.of(LOAD_MODEL)) == loads + (deployment.desired_replicas - 2)  # only beyond the drained one


def test_a_worker_that_stopped_reporting_does_not_let_an_in_use_deployment_go_to_zero(
        sent, commit, make_worker, make_model, settings):
    settings.TESSERA_RECONCILE_SECONDS = 1000
    settings.TESSERA_WORKER_DEAD_SECONDS = 10_000  # silent, not yet dead
    w = make_worker("w0")
    deployment = services.deployment_create(model=make_model(), replicas=1, min_replicas=0, max_replicas=2)
    beat(w, at(0), running=4)
    reconcile(commit, at(0))
    ready_all(commit)
    for second in range(10, 3000, 30):  # the worker is silent from here on; no usage records either
        reconcile(commit, at(second))
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 1 and not autoscale_events()
    assert AutoscalerState.objects.get().reason == "signals_missing"


def test_idle_goes_to_zero_then_a_wake_brings_one_back_and_keeps_it_through_the_cooldown(
        sent, commit, make_worker, make_model, settings):
    from controlplane.deployments.autoscale.service import autoscale_wake

    settings.TESSERA_RECONCILE_SECONDS = 1000
    w = make_worker("w0")
    deployment = services.deployment_create(model=make_model(), replicas=1, min_replicas=0, max_replicas=2)
    beat(w, at(0))
    reconcile(commit, at(0))
    ready_all(commit)
    for second in (10, 320):
        beat(w, at(second))
        reconcile(commit, at(second))
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 0 and autoscale_events()[-1].changes["reason"] == [None, "idle"]
    beat(w, at(325))
    reconcile(commit, at(325))  # drained (idle heartbeat after the gateways' poll): unloaded
    assert Replica.objects.get().status == "stopping"
    assert [d.name for d in selectors.dormant_table()] == [deployment.served_name]
    with commit():
        assert autoscale_wake(deployment_id=deployment.pk, now=at(330)) is True
        assert autoscale_wake(deployment_id=deployment.pk, now=at(331)) is False  # a burst wakes it once
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 1
    event = autoscale_events()[-1]
    assert event.changes["reason"] == [None, "cold_start"] and event.changes["desired_replicas"] == [0, 1]
    assert AutoscalerState.objects.get().cold_starts == 1
    beat(w, at(340))
    reconcile(commit, at(340))
    with commit():
        Replica.objects.filter(status="stopping").delete()  # the worker confirmed the unload
    beat(w, at(345))
    reconcile(commit, at(345))
    ready_all(commit)
    assert selectors.dormant_table() == []
    for second in range(350, 630, 30):  # idle again, but the cold start's cooldown keeps the replica
        beat(w, at(second))
        reconcile(commit, at(second))
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 1


def test_bounds_changed_by_an_operator_apply_at_once(fleet, commit):
    deployment, _ = fleet
    with commit():
        services.deployment_update(deployment=deployment, min_replicas=2)
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 2  # clamped by the service, audited as the operator's update
    with commit():
        services.deployment_update(deployment=deployment, min_replicas=0, max_replicas=1)
    deployment.refresh_from_db()
    assert deployment.desired_replicas == 1


def test_autoscaler_metrics_are_exported(fleet, commit, client):
    deployment, workers = fleet
    for w in workers:
        beat(w, at(5))
    reconcile(commit, at(5))
    from prometheus_client import generate_latest

    from controlplane.slo.metrics import REGISTRY

    text = generate_latest(REGISTRY).decode()
    name = deployment.name
    assert f'tessera:autoscaler_desired_replicas{{accelerator="",autoscaled="true",deployment="{name}"}} 1.0' in text
    assert f'tessera:autoscaler_max_replicas{{deployment="{name}"}} 3.0' in text
    assert f'tessera:autoscaler_signal{{deployment="{name}",signal="reporting"}} 1.0' in text
    assert f'tessera:autoscaler_decisions_total{{deployment="{name}",direction="up"}} 0.0' in text
    assert f'tessera:autoscaler_state{{deployment="{name}",reason="at_min"}} 1.0' in text


def test_an_operator_s_change_during_the_pass_is_not_overwritten(fleet, commit):
    from controlplane.deployments.autoscale.service import deployment_autoscale

    deployment, workers = fleet
    stale = Deployment.objects.get(pk=deployment.pk)  # what the pass read
    (serving,) = busy_workers(deployment)
    beat(serving, at(5), waiting=40)
    with commit():
        services.deployment_update(deployment=deployment, replicas=3)  # the operator's PATCH lands meanwhile
    decision = deployment_autoscale(deployment=stale, now=at(5))
    assert decision.direction == "up" and decision.current == 1
    assert Deployment.objects.get().desired_replicas == 3 and not autoscale_events()
    assert AutoscalerState.objects.get().ups == 0
