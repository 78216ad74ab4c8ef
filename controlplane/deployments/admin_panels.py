"""Reads for the deployment admin page's read-only panel: its replicas, and the health of the workers
that hold them. One query (replicas joined with their workers), whatever the replica count."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from . import conf
from .models import Deployment, Replica, Worker, WorkerStatus

# How many heartbeat intervals may pass before a worker shows as late (the reconciler only calls it
# dead after TESSERA_WORKER_DEAD_SECONDS; "late" warns before replicas move).
LATE_HEARTBEATS = 3


def worker_health(worker: Worker | None, *, now: dt.datetime) -> str:
    if worker is None:
        return "no worker"
    if worker.status == WorkerStatus.DEAD:
        return "dead"
    if worker.last_heartbeat_at is None:
        return "no heartbeat yet"
    age = (now - worker.last_heartbeat_at).total_seconds()
    if age > conf.get("TESSERA_WORKER_DEAD_SECONDS"):
        return "missed heartbeats"
    if age > LATE_HEARTBEATS * conf.get("TESSERA_WORKER_HEARTBEAT_SECONDS"):
        return "late heartbeat"
    if worker.cordoned or worker.status == WorkerStatus.DRAINING:
        return "draining"
    if worker.status == WorkerStatus.STARTING:
        return "starting"
    return "healthy"


def _heartbeat_age(worker: Worker | None, now: dt.datetime) -> str:
    if worker is None or worker.last_heartbeat_at is None:
        return "never"
    return f"{(now - worker.last_heartbeat_at).total_seconds():.0f} s ago"


def deployment_panel(deployment: Deployment, *, now: dt.datetime | None = None) -> dict:
    now = now or timezone.now()
    replicas = list(Replica.objects.filter(deployment=deployment).select_related("worker").order_by("id"))
    workers: dict[int, Worker] = {}
    rows = []
    for replica in replicas:
        worker = replica.worker
        if worker is not None:
            workers[worker.pk] = worker
        rows.append({"replica": replica, "worker": worker, "health": worker_health(worker, now=now),
                     "heartbeat": _heartbeat_age(worker, now)})
    worker_rows = [
        {"worker": w, "health": worker_health(w, now=now), "heartbeat": _heartbeat_age(w, now),
         "replicas": sum(1 for r in replicas if r.worker_id == w.pk)}
        for w in sorted(workers.values(), key=lambda w: w.name)
    ]
    ready = sum(1 for r in replicas if r.status == "ready")
    return {"replicas": rows, "workers": worker_rows, "ready": ready, "desired": deployment.desired_replicas}
