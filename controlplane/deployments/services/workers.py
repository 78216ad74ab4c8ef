"""Writes about workers: registration, heartbeats, drains, and what happens when one goes away."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from common.errors import ApplicationError
from controlplane import audit

from .. import conf, dispatch
from ..models import ACTIVE_REPLICA_STATUSES, Replica, ReplicaStatus, Worker, WorkerStatus
from .reports import replica_fail, replica_mark_ready

log = logging.getLogger("tessera.deployments")

REPORTED_STATUSES = {WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.DRAINING}


def worker_register(*, name: str, url: str, boot_id: str, accelerator: str = "", memory_bytes: int | None = None,
                    labels: dict | None = None, status: str = WorkerStatus.STARTING, device_count: int = 1) -> Worker:
    """Create or refresh a worker. A new boot id means the process restarted: what it held is gone.

    A name is bound to the boot id that registered it: another boot id may take the name over only
    once that registration is gone (released by its worker or an operator, marked dead, or without
    a heartbeat for TESSERA_WORKER_DEAD_SECONDS); until then it is refused (409), as is a URL a
    live worker of another name advertises.
    """
    if status not in REPORTED_STATUSES:
        raise ApplicationError(f"status: {status!r} is not one of starting, ready, draining.", code="invalid_value",
                               param="status")
    if not boot_id:
        raise ApplicationError("boot_id: required.", code="invalid_value", param="boot_id")
    now = timezone.now()
    with transaction.atomic():
        worker, created = Worker.objects.select_for_update().get_or_create(
            name=name, defaults={"url": url, "boot_id": boot_id, "status": status})
        if not created and worker.boot_id != boot_id and _live(worker, now):
            log.warning("worker registration refused: the name is held by a live boot",
                        extra={"worker": name, "url": url, "boot_id": boot_id})
            raise ApplicationError(f"Worker {name!r} is registered by another process that is still alive; it "
                                   "can be taken over once that one is released or expires.",
                                   code="worker_name_taken", status=409)
        if _url_holder(name, url, now):
            log.warning("worker registration refused: the URL is a live worker's", extra={"worker": name, "url": url})
            raise ApplicationError(f"Another live worker advertises {url}.", code="worker_url_taken", status=409)
        if not created and worker.boot_id != boot_id:
            _release_replicas(worker, f"worker {name} restarted")
            worker.cordoned = False  # a drain lasts until the process restarts (or an uncordon)
        worker.url, worker.boot_id, worker.status = url, boot_id, status
        worker.accelerator, worker.memory_bytes, worker.labels = accelerator, memory_bytes, labels or {}
        worker.device_count = device_count
        worker.last_heartbeat_at = now
        worker.loaded_model, worker.loaded_adapters = "", []
        worker.save()
        dispatch.reconcile_soon()
    log.info("worker registered", extra={"worker": name, "url": url, "boot_id": boot_id, "new": created})
    return worker


def _live(worker: Worker, now) -> bool:
    """Whether a registration still holds its name: a boot id, not dead, a heartbeat within the dead time."""
    if not worker.boot_id or worker.status == WorkerStatus.DEAD or worker.last_heartbeat_at is None:
        return False
    return (now - worker.last_heartbeat_at).total_seconds() < conf.get("TESSERA_WORKER_DEAD_SECONDS")


def _url_holder(name: str, url: str, now) -> Worker | None:
    for other in Worker.objects.filter(url=url).exclude(name=name):
        if _live(other, now):
            return other
    return None


def worker_release(*, worker: Worker, reason: str) -> Worker:
    """End a registration (its worker stopping cleanly, or an operator): the name is free for a new boot."""
    with audit.change("worker.release", worker, fields=["status", "boot_id"]):
        worker = worker_mark_dead(worker=worker, reason=reason)
        Worker.objects.filter(pk=worker.pk).update(boot_id="")
    worker.refresh_from_db()
    log.warning("worker registration released", extra={"worker": worker.name, "reason": reason})
    return worker


def worker_heartbeat(*, worker: Worker, boot_id: str, status: str, slot: dict | None = None,
                     adapters: list[str] | None = None, running: int = 0, waiting: int = 0,
                     kv_cache_usage: float = 0.0, stats: dict | None = None) -> Worker:
    """Record a heartbeat and the load figures; reconcile what the worker says it holds."""
    if status not in REPORTED_STATUSES:
        raise ApplicationError(f"status: {status!r} is not one of starting, ready, draining.", code="invalid_value",
                               param="status")
    with transaction.atomic():
        worker = Worker.objects.select_for_update().get(pk=worker.pk)
        if worker.boot_id != boot_id:
            raise ApplicationError("This worker restarted; register again.", code="worker_reregister", status=409)
        previous = worker.status
        slot = slot or {}
        worker.status = status
        worker.last_heartbeat_at = timezone.now()
        worker.loaded_model = (slot.get("served_name") or "") if slot.get("state") == "ready" else ""
        worker.loaded_adapters = list(adapters or [])
        worker.num_running, worker.num_waiting, worker.kv_cache_usage = running, waiting, kv_cache_usage
        worker.stats = {**(stats or {}), "slot": slot}
        worker.save()
        _sync_slot(worker, slot)
        if previous != status and (status == WorkerStatus.DRAINING or previous == WorkerStatus.DEAD):
            dispatch.reconcile_soon()
    return worker


def _sync_slot(worker: Worker, slot: dict) -> None:
    """A ready report lost on the way is recovered from the heartbeat; a dead engine fails its replica."""
    uid, attempt, state = slot.get("replica_uid"), slot.get("attempt"), slot.get("state")
    if not uid:
        return
    replica = Replica.objects.select_for_update().filter(worker=worker, uid=uid, attempt=attempt).first()
    if replica is None:
        return
    if state == "ready" and replica.status == ReplicaStatus.LOADING:
        replica_mark_ready(replica=replica, load_seconds=slot.get("load_seconds"), gate=slot.get("gate"))
    elif state == "dead" and replica.status == ReplicaStatus.READY:
        replica_fail(replica=replica, reason=f"the engine on worker {worker.name} stopped: {slot.get('error', '')}",
                     permanent=False)


def worker_cordon(*, worker: Worker, cordoned: bool = True) -> Worker:
    """Operator drain: no new replicas here; the reconciler moves the existing ones (make before break)."""
    action = "worker.cordon" if cordoned else "worker.uncordon"
    with transaction.atomic(), audit.change(action, worker, fields=["cordoned"]):
        Worker.objects.filter(pk=worker.pk).update(cordoned=cordoned)
        dispatch.reconcile_soon()
    worker.refresh_from_db()
    return worker


def worker_mark_dead(*, worker: Worker, reason: str) -> Worker:
    with transaction.atomic():
        worker = Worker.objects.select_for_update().get(pk=worker.pk)
        worker.status = WorkerStatus.DEAD
        worker.loaded_model, worker.loaded_adapters = "", []
        worker.num_running = worker.num_waiting = 0
        worker.save()
        moved = _release_replicas(worker, reason)
        dispatch.reconcile_soon()
    log.warning("worker marked dead", extra={"worker": worker.name, "reason": reason, "replicas_moved": moved})
    return worker


def _release_replicas(worker: Worker, reason: str) -> int:
    """The worker holds nothing any more: replicas it was stopping are gone, the others wait for a new home."""
    moved = 0
    for replica in Replica.objects.select_for_update().filter(worker=worker, status__in=ACTIVE_REPLICA_STATUSES):
        replica.adapter_placements.all().delete()
        if replica.status == ReplicaStatus.STOPPING:
            replica.delete()
            continue
        replica.worker = None
        replica.status = ReplicaStatus.PENDING
        replica.reason = f"rescheduling: {reason}"
        replica.ready_at = None
        replica.save()
        moved += 1
    return moved


def worker_report(worker: Worker) -> dict[str, Any]:
    """What the register/heartbeat answer tells the worker."""
    return {"worker": worker.name, "queue": worker.queue, "status": worker.status,
            "heartbeat_seconds": conf.get("TESSERA_WORKER_HEARTBEAT_SECONDS")}
