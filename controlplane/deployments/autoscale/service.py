"""The autoscaler's I/O: read signals and history, call `policy.decide`, write what it says.

`deployment_autoscale` runs inside the reconciler's pass (its transaction and advisory lock), for
each deployment with `max_replicas` set, before the replicas are reconciled, so a decision is
acted on in the same pass. `autoscale_wake` is the gateway's: the first request for a deployment
scaled to zero raises it to max(1, min_replicas).

Every change of desired replicas is one audit event `deployment.autoscale` (actor: the reconciler's
task, or the gateway for a cold start) whose changes carry the reason and the signals behind it. A
hold changes nothing and is not audited (a pass every 5 s would bury the log); the last hold's
reason is on the AutoscalerState row and in `tessera:autoscaler_*` (metrics.py).

The desired count is written with a compare-and-set on the value read, so an operator's PATCH that
lands during the pass is never overwritten by a decision made on the old value.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction
from django.utils import timezone

from controlplane import audit

from .. import conf, dispatch
from ..models import AutoscalerState, Deployment, Replica
from .policy import Decision, History, Policy, Signals, decide
from .signals import read_signals

log = logging.getLogger("tessera.deployments")


def policy_for(deployment: Deployment) -> Policy:
    g = conf.get
    return Policy(
        min_replicas=deployment.min_replicas, max_replicas=int(deployment.max_replicas or 0),
        target_waiting=g("TESSERA_AUTOSCALE_TARGET_WAITING"), low_waiting=g("TESSERA_AUTOSCALE_LOW_WAITING"),
        kv_high=g("TESSERA_AUTOSCALE_KV_HIGH"), kv_low=g("TESSERA_AUTOSCALE_KV_LOW"),
        burn_high=g("TESSERA_AUTOSCALE_BURN_HIGH"), burn_low=g("TESSERA_AUTOSCALE_BURN_LOW"),
        up_cooldown=g("TESSERA_AUTOSCALE_UP_COOLDOWN_SECONDS"),
        down_cooldown=g("TESSERA_AUTOSCALE_DOWN_COOLDOWN_SECONDS"),
        down_stable=g("TESSERA_AUTOSCALE_DOWN_STABLE_SECONDS"), idle_seconds=g("TESSERA_AUTOSCALE_IDLE_SECONDS"),
    )


def _ts(value: dt.datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: float | None) -> dt.datetime | None:
    return None if value is None else dt.datetime.fromtimestamp(value, tz=dt.UTC)


def history_of(state: AutoscalerState) -> History:
    return History(_ts(state.last_up_at), _ts(state.last_down_at), _ts(state.low_since))


def deployment_autoscale(*, deployment: Deployment, now: dt.datetime | None = None,
                         replicas: list[Replica] | None = None) -> Decision | None:
    """One decision for one deployment; None when it is not autoscaled (or is being deleted)."""
    if not deployment.autoscaled or deployment.deleting:
        return None
    now = now or timezone.now()
    state, _ = AutoscalerState.objects.get_or_create(deployment=deployment)
    signals = read_signals(deployment=deployment, now=now, replicas=replicas)
    decision = decide(signals, policy_for(deployment), history_of(state))
    state.low_since = _dt(decision.low_since)
    state.recommended, state.reason, state.detail = decision.desired, decision.reason, decision.detail[:300]
    state.signals = signals.as_dict()
    if decision.direction != "hold" and _apply(deployment, decision, signals):
        if decision.direction == "up":
            state.last_up_at, state.ups = now, state.ups + 1
        else:
            state.last_down_at, state.downs = now, state.downs + 1
    state.save()
    return decision


def _apply(deployment: Deployment, decision: Decision, signals: Signals) -> bool:
    changed = Deployment.objects.filter(pk=deployment.pk, desired_replicas=decision.current, deleting=False) \
        .update(desired_replicas=decision.desired)
    if not changed:
        log.info("autoscale skipped: the deployment changed during the pass", extra={"deployment": deployment.name})
        return False
    deployment.desired_replicas = decision.desired
    audit.record("deployment.autoscale", deployment, changes={
        "desired_replicas": [decision.current, decision.desired],
        "reason": [None, decision.reason], "detail": [None, decision.detail], "signals": [None, signals.as_dict()]})
    log.info("autoscaled", extra={"deployment": deployment.name, "from": decision.current, "to": decision.desired,
                                  "reason": decision.reason, "detail": decision.detail})
    return True


def autoscale_wake(*, deployment_id: int, now: dt.datetime | None = None) -> bool:
    """A request for a deployment scaled to zero: want max(1, min_replicas) now. -> whether it changed."""
    now = now or timezone.now()
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().filter(pk=deployment_id, deleting=False).first()
        if deployment is None or not deployment.autoscaled or deployment.desired_replicas > 0:
            return False  # already waking (or not ours to wake): idempotent under a burst of requests
        wanted = max(1, deployment.min_replicas)
        deployment.desired_replicas = wanted
        deployment.save(update_fields=["desired_replicas", "updated_at"])
        state, _ = AutoscalerState.objects.get_or_create(deployment=deployment)
        # The cold start counts as an increase: the down cooldown keeps the new replica for at least
        # TESSERA_AUTOSCALE_DOWN_COOLDOWN_SECONDS, long enough for the client's retry to find it.
        state.last_up_at, state.low_since, state.cold_starts = now, None, state.cold_starts + 1
        state.recommended, state.reason, state.detail = wanted, "cold_start", "a request arrived at zero replicas"
        state.save()
        audit.record("deployment.autoscale", deployment, changes={
            "desired_replicas": [0, wanted], "reason": [None, "cold_start"],
            "detail": [None, "a request arrived at zero replicas"], "signals": [None, {"current": 0}]})
        dispatch.reconcile_soon()
    log.info("cold start", extra={"deployment": deployment.name, "to": wanted})
    return True
