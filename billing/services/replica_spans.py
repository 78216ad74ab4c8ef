"""Replicas' serving time, sampled: each observation extends the span of every ready replica.

Why sampled and not hooked into the replica's state changes: a replica leaves `ready` in several
places (a report, a dead worker, the reconciler) and its row is deleted soon after; one reader of
the deployments' tables that runs every minute (beat) sees all of them without any of those paths
knowing about money. The price is precision at the end of a span: a replica that stopped is counted
up to the last observation that found it ready (up to one interval short), documented in docs/billing.md.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from billing.costs.classes import worker_class_of
from billing.models import ReplicaSpan
from controlplane.deployments.models import Replica, ReplicaStatus


def replica_spans_observe(*, now: datetime | None = None) -> int:
    """Extend (or open) the span of every ready replica to `now`. Idempotent; returns the spans touched.

    A replica that was ready, failed and became ready again has a new `ready_at`, hence a new span.
    """
    now = now or timezone.now()
    ready = (Replica.objects.filter(status=ReplicaStatus.READY, worker__isnull=False, ready_at__isnull=False,
                                    ready_at__lte=now)
             .select_related("deployment__model", "worker"))
    touched = 0
    with transaction.atomic():
        for replica in ready:
            worker = replica.worker
            span, created = ReplicaSpan.objects.select_for_update().get_or_create(
                replica_uid=replica.uid, started_at=replica.ready_at,
                defaults={
                    "last_seen_at": now, "deployment": replica.deployment.name,
                    "model": replica.deployment.served_name or replica.deployment.model.name,
                    "worker": worker.name, "worker_url": worker.url,
                    "worker_class": worker_class_of(labels=worker.labels, accelerator=worker.accelerator),
                },
            )
            if not created and span.last_seen_at < now:
                span.last_seen_at = now
                span.save(update_fields=["last_seen_at"])
            touched += 1
    return touched
