"""Desired versus actual, every few seconds (Celery beat → `deployments.reconcile`) and after changes.

One pass, in one transaction (at most one pass at a time: a PostgreSQL advisory lock; SQLite
serialises writers anyway):

1. Workers whose heartbeat is older than TESSERA_WORKER_DEAD_SECONDS are dead; their replicas go
   back to `pending` (same replica, worker cleared) and are placed elsewhere below.
2. Per deployment: failed replicas whose backoff passed go back to `pending`; loads that never
   started are sent again (bounded) and loads that take too long fail; missing replicas are
   created and extra ones stopped (failed, then pending, then loading, then ready; newest first).
   Replicas on a cordoned or draining worker are replaced first and stopped only once the
   replacements are ready (make before break). Pending replicas go to a free worker that matches
   the placement (one engine per worker process, so one active replica per worker). A deployment
   with `max_replicas` set is autoscaled first (autoscale/service.py decides its desired count), and
   the ready replicas it removes are drained before they are unloaded (autoscale/drain.py).
3. Adapters: each is placed on every ready replica of its base model whose deployment has LoRA
   slots (`max_adapters`), and unloaded everywhere before a deleted one is removed.

Failed replicas keep their place in the count, so a load that cannot work (a bad source) stays
`failed` with its reason instead of being re-created every pass: no retry storm.

After an outage of the control plane itself (its database, broker or beat: passes stopped for longer
than twice TESSERA_RECONCILE_SECONDS; ReconcilerState), workers' heartbeats in that time may have
been lost rather than not sent: for one TESSERA_WORKER_DEAD_SECONDS no worker is declared dead on
heartbeats older than the pass that resumed (no replica flaps when the database comes back), and
loads and adapter loads not yet confirmed are sent again at once (their messages may have died with
the broker; the worker-side tasks are idempotent).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from . import conf, dispatch
from .autoscale import drain
from .autoscale import service as autoscale
from .models import (
    ACTIVE_REPLICA_STATUSES,
    Adapter,
    AdapterPlacement,
    AdapterStatus,
    Deployment,
    PlacementStatus,
    ReconcilerState,
    Replica,
    ReplicaRole,
    ReplicaStatus,
    Worker,
    WorkerStatus,
)
from .services.reports import _placement_fail, adapter_refresh_status, replica_fail
from .services.workers import worker_mark_dead

log = logging.getLogger("tessera.deployments")

ADVISORY_LOCK_KEY = 0x7E55E7A  # "tessera" reconciler
REMOVAL_ORDER = {ReplicaStatus.FAILED: 0, ReplicaStatus.PENDING: 1, ReplicaStatus.LOADING: 2, ReplicaStatus.READY: 3}


@dataclass
class ReconcileResult:
    dead_workers: list[str] = field(default_factory=list)
    created: int = 0
    dispatched: int = 0
    redispatched: int = 0
    stopping: int = 0
    failed: int = 0
    retried: int = 0
    adapter_dispatches: int = 0
    skipped: bool = False
    resumed: bool = False  # the first pass after a gap (see the module's docstring)

    def as_dict(self) -> dict:
        return asdict(self)


def reconcile(*, now: dt.datetime | None = None) -> ReconcileResult:
    now = now or timezone.now()
    result = ReconcileResult()
    with transaction.atomic():
        if not _lock():
            result.skipped = True
            return result
        resumed_at = _tick(now, result)
        _mark_dead_workers(now, resumed_at, result)
        fresh_after = now - dt.timedelta(seconds=conf.get("TESSERA_WORKER_DEAD_SECONDS"))
        busy = set(Replica.objects.filter(status__in=ACTIVE_REPLICA_STATUSES, worker__isnull=False)
                   .values_list("worker_id", flat=True))
        free = [w for w in Worker.objects.filter(status=WorkerStatus.READY, cordoned=False,
                                                 last_heartbeat_at__gte=fresh_after).order_by("name")
                if w.pk not in busy]
        for deployment in Deployment.objects.select_related("model").order_by("id"):
            _reconcile_deployment(deployment, free, now, result)
        _reconcile_adapters(now, result)
    if any((result.dead_workers, result.created, result.dispatched, result.redispatched, result.stopping,
            result.failed, result.resumed)):
        log.info("reconciled", extra={"reconcile": result.as_dict()})
    return result


def _lock() -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_KEY])
        return bool(cursor.fetchone()[0])


def max_gap_seconds() -> float:
    """Passes further apart than this mean the control plane was away (beat sends one per interval)."""
    return 2 * conf.get("TESSERA_RECONCILE_SECONDS")


def _tick(now: dt.datetime, result: ReconcileResult) -> dt.datetime | None:
    """Record this pass; -> when the control plane last came back (None: never seen away)."""
    state, _ = ReconcilerState.objects.get_or_create(pk=1)
    previous = state.last_pass_at
    if previous is not None and (now - previous).total_seconds() > max_gap_seconds():
        state.resumed_at = now
        result.resumed = True
        log.warning("reconciler resumed after a gap: no worker is declared dead before it has had a full "
                    "heartbeat window", extra={"gap_seconds": round((now - previous).total_seconds(), 1),
                                               "window_seconds": conf.get("TESSERA_WORKER_DEAD_SECONDS")})
    state.last_pass_at = now
    state.save()
    return state.resumed_at


def _mark_dead_workers(now: dt.datetime, resumed_at: dt.datetime | None, result: ReconcileResult) -> None:
    seconds = conf.get("TESSERA_WORKER_DEAD_SECONDS")
    cutoff = now - dt.timedelta(seconds=seconds)
    if resumed_at is not None and resumed_at > cutoff:
        return  # staleness counts from max(last heartbeat, resumed_at): nobody can be stale yet
    stale = Worker.objects.filter(
        Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True, registered_at__lt=cutoff),
        status__in=[WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.DRAINING])
    for worker in stale:
        worker_mark_dead(worker=worker, reason=f"worker {worker.name} missed heartbeats for {seconds:.0f} s")
        result.dead_workers.append(worker.name)


def matches(worker: Worker, placement: dict) -> bool:
    accelerator = placement.get("accelerator")
    if accelerator and accelerator.lower() not in (worker.accelerator or "").lower():
        return False
    min_gib = placement.get("min_memory_gib")
    if min_gib and (worker.memory_bytes or 0) < min_gib * 2**30:
        return False
    if any((worker.labels or {}).get(k) != v for k, v in (placement.get("labels") or {}).items()):
        return False
    names = placement.get("workers")
    return not names or worker.name in names


def _leaving(replica: Replica) -> bool:
    worker = replica.worker
    return worker is not None and (worker.cordoned or worker.status == WorkerStatus.DRAINING)


def _reconcile_deployment(deployment: Deployment, free: list[Worker], now: dt.datetime,
                          result: ReconcileResult) -> None:
    replicas = list(deployment.replicas.select_related("worker").order_by("id"))
    desired = 0 if deployment.deleting else deployment.desired_replicas
    for replica in replicas:
        if replica.status == ReplicaStatus.FAILED and replica.retry_at and replica.retry_at <= now:
            replica.status, replica.retry_at = ReplicaStatus.PENDING, None
            replica.reason = f"retrying; last failure: {replica.reason}"
            replica.save()
            result.retried += 1
        elif replica.status == ReplicaStatus.LOADING:
            _check_loading(replica, now, result)
        elif replica.status == ReplicaStatus.STOPPING:
            _check_stopping(replica, now)
    replicas = [r for r in replicas if r.pk is not None]
    serving = [r for r in replicas if r.role == ReplicaRole.SERVE]
    if deployment.autoscaled and not deployment.deleting:
        autoscale.deployment_autoscale(deployment=deployment, now=now, replicas=serving)
        desired = deployment.desired_replicas
    drains = deployment.autoscaled and not deployment.deleting  # autoscaled removals drain first (drain.py)
    _converge(deployment, serving, desired, drains, ReplicaRole.SERVE, free, now, result)
    # Prefill replicas (disaggregated serving): a fixed count, not autoscaled; removed without a drain (a
    # serving replica whose prefill worker goes computes the prompt itself)
    prefilling = [r for r in replicas if r.role == ReplicaRole.PREFILL]
    _converge(deployment, prefilling, 0 if deployment.deleting else deployment.prefill_replicas, False,
              ReplicaRole.PREFILL, free, now, result)
    if deployment.deleting and not deployment.replicas.exists():
        log.info("deployment removed", extra={"deployment": deployment.name})
        deployment.delete()


def _converge(deployment: Deployment, replicas: list[Replica], desired: int, drains: bool, role: str,
              free: list[Worker], now: dt.datetime, result: ReconcileResult) -> None:
    """Bring one role's replicas to `desired`: create or stop (draining first when `drains`), then place."""
    live = [r for r in replicas if r.status != ReplicaStatus.STOPPING]
    leaving = [r for r in live if _leaving(r)]
    draining = [r for r in live if not _leaving(r) and r.drain_started_at is not None]
    staying = [r for r in live if not _leaving(r) and r.drain_started_at is None]
    if len(staying) < desired:
        for replica in sorted(draining, key=lambda r: -r.pk)[:desired - len(staying)]:
            drain.drain_cancel(replica=replica)  # taking a drain back is cheaper than a new load
            draining.remove(replica)
            staying.append(replica)
        for _ in range(desired - len(staying)):
            staying.append(Replica.objects.create(deployment=deployment, role=role, reason="waiting for a worker"))
            result.created += 1
    elif len(staying) > desired:
        extras = sorted(staying, key=lambda r: (REMOVAL_ORDER[ReplicaStatus(r.status)], -r.pk))[:len(staying) - desired]
        for replica in extras:
            if drains and replica.status == ReplicaStatus.READY and replica.worker is not None:
                drain.drain_start(replica=replica, now=now)
                draining.append(replica)
            else:
                _stop(replica, result)
        staying = [r for r in staying if r not in extras]
    for replica in draining:
        if not drains or drain.drained(replica=replica, now=now):
            _stop(replica, result)
    if leaving and sum(r.status == ReplicaStatus.READY for r in staying) >= desired:
        for replica in leaving:
            _stop(replica, result)
    for replica in staying:
        if replica.status == ReplicaStatus.PENDING:
            _place(replica, deployment, free, now, result)


def devices_needed(deployment: Deployment) -> int:
    """Devices one replica spans: its tensor-parallel ranks (engine_args), one device each."""
    return int((deployment.engine_args or {}).get("tensor_parallel_size", 1))


def _place(replica: Replica, deployment: Deployment, free: list[Worker], now: dt.datetime,
           result: ReconcileResult) -> None:
    needed = devices_needed(deployment)
    worker = next((w for w in free if matches(w, deployment.placement or {}) and w.device_count >= needed), None)
    if worker is None:
        reason = "waiting for a free ready worker that matches the placement"
        if needed > 1:
            reason += f" and has {needed} devices (tensor_parallel_size {needed})"
        if replica.reason != reason and not replica.reason.startswith("rescheduling"):
            replica.reason = reason
            replica.save(update_fields=["reason", "updated_at"])
        return
    free.remove(worker)
    replica.worker, replica.status = worker, ReplicaStatus.LOADING
    replica.attempt += 1
    replica.dispatched_at, replica.redispatches = now, 0
    replica.reason = f"load sent to {worker.name}"
    replica.save()
    dispatch.load_model(replica=replica)
    result.dispatched += 1


def _slot_mentions(replica: Replica) -> bool:
    slot = (replica.worker.stats or {}).get("slot") or {}
    return slot.get("replica_uid") == str(replica.uid) and slot.get("attempt") == replica.attempt


def _check_loading(replica: Replica, now: dt.datetime, result: ReconcileResult) -> None:
    started = replica.dispatched_at or replica.updated_at
    timeout = conf.get("TESSERA_REPLICA_LOAD_TIMEOUT_SECONDS")
    if now - started > dt.timedelta(seconds=timeout):
        replica_fail(replica=replica, reason=f"the load did not finish within {timeout:.0f} s", permanent=False)
        result.failed += 1
        return
    redispatch = conf.get("TESSERA_REPLICA_REDISPATCH_SECONDS")
    due = result.resumed or now - started > dt.timedelta(seconds=redispatch * (replica.redispatches + 1))
    if not due or _slot_mentions(replica):
        return
    if replica.redispatches >= conf.MAX_REDISPATCHES:
        replica_fail(replica=replica, reason=f"worker {replica.worker.name} never started the load "
                     f"({replica.redispatches + 1} messages sent)", permanent=False)
        result.failed += 1
        return
    replica.redispatches += 1
    replica.save(update_fields=["redispatches", "updated_at"])
    dispatch.load_model(replica=replica)  # same attempt: the task is idempotent
    result.redispatched += 1


def _check_stopping(replica: Replica, now: dt.datetime) -> None:
    if now - replica.updated_at <= dt.timedelta(seconds=conf.get("TESSERA_REPLICA_REDISPATCH_SECONDS")):
        return
    if replica.worker is None or replica.redispatches >= conf.MAX_REDISPATCHES:
        log.warning("replica removed without an unload confirmation", extra={"replica": replica.pk})
        replica.delete()
        return
    replica.redispatches += 1
    replica.save(update_fields=["redispatches", "updated_at"])
    dispatch.unload_model(replica=replica)


def _stop(replica: Replica, result: ReconcileResult) -> None:
    replica.adapter_placements.all().delete()
    if replica.worker is None or replica.status in (ReplicaStatus.PENDING, ReplicaStatus.FAILED):
        replica.delete()
        return
    replica.status, replica.redispatches = ReplicaStatus.STOPPING, 0
    replica.reason = "unload sent"
    replica.save()
    dispatch.unload_model(replica=replica)
    result.stopping += 1


# --- adapters -------------------------------------------------------------------------------------

def _reconcile_adapters(now: dt.datetime, result: ReconcileResult) -> None:
    hosts: dict[int, list[Replica]] = defaultdict(list)
    for replica in (Replica.objects.filter(status=ReplicaStatus.READY, deployment__max_adapters__gt=0)
                    .select_related("deployment", "worker").order_by("id")):
        if not _leaving(replica) and replica.drain_started_at is None:
            hosts[replica.deployment.model_id].append(replica)
    used: dict[int, int] = defaultdict(int)
    for replica_id in AdapterPlacement.objects.values_list("replica_id", flat=True):
        used[replica_id] += 1
    timeout = dt.timedelta(seconds=conf.get("TESSERA_REPLICA_LOAD_TIMEOUT_SECONDS"))
    for adapter in Adapter.objects.select_related("base_model").order_by("id"):
        placements = list(adapter.placements.select_related("replica__worker"))
        if adapter.status == AdapterStatus.DELETING:
            for placement in placements:
                _stop_placement(placement, now, result)
            adapter_refresh_status(adapter=adapter)
            continue
        placed = {p.replica_id for p in placements}
        for host in hosts[adapter.base_model_id]:
            if host.pk not in placed and used[host.pk] < host.deployment.max_adapters:
                placements.append(AdapterPlacement.objects.create(adapter=adapter, replica=host))
                used[host.pk] += 1
        for placement in placements:
            if placement.status == PlacementStatus.FAILED and placement.retry_at and placement.retry_at <= now:
                placement.status, placement.retry_at = PlacementStatus.PENDING, None
            if placement.status == PlacementStatus.LOADING and placement.dispatched_at and \
                    now - placement.dispatched_at > timeout:
                _placement_fail(placement, "the adapter load did not finish in time", permanent=False)
            elif placement.status == PlacementStatus.LOADING:
                _check_placement_loading(placement, now, result)
            if placement.status == PlacementStatus.PENDING and placement.replica.status == ReplicaStatus.READY:
                placement.status, placement.dispatched_at = PlacementStatus.LOADING, now
                placement.attempt += 1
                placement.redispatches = 0
                placement.save()
                dispatch.load_adapter(placement=placement, worker=placement.replica.worker)
                result.adapter_dispatches += 1
        adapter_refresh_status(adapter=adapter)


def _check_placement_loading(placement: AdapterPlacement, now: dt.datetime, result: ReconcileResult) -> None:
    """A load_adapter message lost (a broker restart) or a lost report: send the same attempt again, a few
    times (the task is idempotent: a worker that holds the adapter only reports it again)."""
    started = placement.dispatched_at or placement.updated_at
    redispatch = conf.get("TESSERA_REPLICA_REDISPATCH_SECONDS")
    due = result.resumed or now - started > dt.timedelta(seconds=redispatch * (placement.redispatches + 1))
    if not due or placement.redispatches >= conf.MAX_REDISPATCHES or placement.replica.worker is None:
        return
    placement.redispatches += 1
    placement.save(update_fields=["redispatches", "updated_at"])
    dispatch.load_adapter(placement=placement, worker=placement.replica.worker)
    result.redispatched += 1


def _stop_placement(placement: AdapterPlacement, now: dt.datetime, result: ReconcileResult) -> None:
    patience = dt.timedelta(seconds=conf.get("TESSERA_REPLICA_REDISPATCH_SECONDS") * conf.MAX_REDISPATCHES)
    if placement.status in (PlacementStatus.PENDING, PlacementStatus.FAILED) or placement.replica.worker is None:
        placement.delete()
    elif placement.status == PlacementStatus.STOPPING and now - placement.updated_at > patience:
        log.warning("adapter placement removed without an unload confirmation", extra={"placement": placement.pk})
        placement.delete()
    elif placement.status != PlacementStatus.STOPPING:
        placement.status = PlacementStatus.STOPPING
        placement.save()
        dispatch.unload_adapter(placement=placement, worker=placement.replica.worker)
        result.adapter_dispatches += 1
