"""Workers report how their tasks went. A report names the attempt it is about; stale ones change nothing."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction
from django.utils import timezone

from billing.costs.classes import worker_class_of
from common.errors import ApplicationError

from .. import adapter_store, conf, dispatch
from ..capacity.curve import LoadCurve as ParsedCurve
from ..models import (
    Adapter,
    AdapterPlacement,
    AdapterStatus,
    LoadCurve,
    PlacementStatus,
    Replica,
    ReplicaStatus,
    Worker,
)

log = logging.getLogger("tessera.deployments")

REPORTABLE = {"loading", "ready", "failed", "stopped"}


def _check(status: str) -> None:
    if status not in REPORTABLE:
        raise ApplicationError(f"status: {status!r} is not one of {sorted(REPORTABLE)}.", code="invalid_value",
                               param="status")


def replica_report(*, worker: Worker, replica_id: int, attempt: int, status: str, reason: str = "",
                   permanent: bool = False, load_seconds: float | None = None, gate: dict | None = None,
                   load_curve: dict | None = None) -> dict:
    """-> {"applied": bool, "status": the replica's status afterwards (or "gone")}."""
    _check(status)
    with transaction.atomic():
        replica = Replica.objects.select_for_update().filter(pk=replica_id).first()
        if replica is None:
            return {"applied": False, "status": "gone"}
        if replica.worker_id != worker.pk or replica.attempt != attempt:
            log.info("stale replica report ignored", extra={"replica": replica_id, "attempt": attempt,
                                                            "current_attempt": replica.attempt, "worker": worker.name})
            return {"applied": False, "status": replica.status}
        applied = True
        if status == "loading" and replica.status == ReplicaStatus.LOADING:
            replica.reason = reason or f"loading on {worker.name}"
            replica.save(update_fields=["reason", "updated_at"])
        elif status == "ready" and replica.status == ReplicaStatus.LOADING:
            replica_mark_ready(replica=replica, load_seconds=load_seconds, gate=gate)
            if load_curve is not None:
                load_curve_record(replica=replica, worker=worker, curve=load_curve)
        elif status == "failed" and replica.status in (ReplicaStatus.LOADING, ReplicaStatus.READY):
            replica_fail(replica=replica, reason=reason or "the worker reported a failure", permanent=permanent,
                         gate=gate)
        elif status == "stopped" and replica.status == ReplicaStatus.STOPPING:
            replica.delete()
            return {"applied": True, "status": "gone"}
        else:
            applied = False
        return {"applied": applied, "status": replica.status}


def replica_mark_ready(*, replica: Replica, load_seconds: float | None = None, gate: dict | None = None) -> None:
    replica.status = ReplicaStatus.READY
    replica.reason = ""
    replica.failures = 0
    replica.retry_at = None
    replica.ready_at = timezone.now()
    replica.load_seconds = load_seconds
    replica.gate = gate
    replica.save()
    dispatch.reconcile_soon()  # adapters follow; a drained worker's old replica may now stop
    log.info("replica ready", extra={"replica": replica.pk, "deployment": replica.deployment_id,
                                     "worker": replica.worker_id, "load_seconds": load_seconds})


def load_curve_record(*, replica: Replica, worker: Worker, curve: dict) -> LoadCurve | None:
    """Keep the curve the worker measured as its class's latest for the deployment; one that does not
    parse is logged and dropped (planning input: never a reason to refuse a ready replica)."""
    try:
        parsed = ParsedCurve.from_dict(curve)
    except ValueError as exc:
        log.warning("load curve ignored", extra={"replica": replica.pk, "worker": worker.name, "error": str(exc)})
        return None
    record, _ = LoadCurve.objects.update_or_create(
        deployment_id=replica.deployment_id,
        worker_class=worker_class_of(labels=worker.labels, accelerator=worker.accelerator),
        defaults={"worker": worker.name, "curve": parsed.to_dict(), "measured_at": timezone.now(),
                  "engine_args": replica.deployment.engine_args})
    return record


def replica_fail(*, replica: Replica, reason: str, permanent: bool, gate: dict | None = None) -> None:
    """Failed: back off and retry (bounded), or stay failed when retrying cannot help."""
    replica.failures += 1
    replica.status = ReplicaStatus.FAILED
    replica.worker = None
    replica.ready_at = None
    replica.gate = gate if gate is not None else replica.gate
    max_attempts = int(conf.get("TESSERA_REPLICA_MAX_ATTEMPTS"))
    if permanent or replica.failures >= max_attempts:
        replica.retry_at = None
        why = "not retried" if permanent else f"gave up after {replica.failures} attempts"
        replica.reason = f"{reason} ({why}; fix the deployment or retry it)"
    else:
        delay = conf.retry_delay(replica.failures)
        replica.retry_at = timezone.now() + dt.timedelta(seconds=delay)
        replica.reason = f"{reason} (attempt {replica.failures} of {max_attempts}; retrying in {delay:.0f} s)"
    replica.save()
    replica.adapter_placements.all().delete()
    log.warning("replica failed", extra={"replica": replica.pk, "deployment": replica.deployment_id,
                                         "reason": replica.reason})


def placement_report(*, worker: Worker, placement_id: int, attempt: int, status: str, reason: str = "",
                     permanent: bool = False, kind: str = "") -> dict:
    """`reason` is the worker's own account (operators only); `kind` picks what the tenant is told."""
    _check(status)
    with transaction.atomic():
        placement = (AdapterPlacement.objects.select_for_update().select_related("replica", "adapter")
                     .filter(pk=placement_id).first())
        if placement is None:
            return {"applied": False, "status": "gone"}
        if placement.replica.worker_id != worker.pk or placement.attempt != attempt:
            return {"applied": False, "status": placement.status}
        adapter = placement.adapter
        if status == "ready" and placement.status == PlacementStatus.LOADING:
            placement.status, placement.reason, placement.failures = PlacementStatus.READY, "", 0
            placement.save()
        elif status == "failed" and placement.status in (PlacementStatus.LOADING, PlacementStatus.READY):
            _placement_fail(placement, reason or "the worker reported a failure", permanent, kind=kind)
        elif status == "stopped" and placement.status == PlacementStatus.STOPPING:
            placement.delete()
        elif status != "loading":
            return {"applied": False, "status": placement.status}
        adapter_refresh_status(adapter=adapter)
        return {"applied": True, "status": placement.status if placement.pk else "gone"}


def _placement_fail(placement: AdapterPlacement, reason: str, permanent: bool, kind: str = "") -> None:
    placement.failures += 1
    placement.error_kind = kind if kind in adapter_store.ERROR_KINDS else "error"
    placement.status = PlacementStatus.FAILED
    max_attempts = int(conf.get("TESSERA_REPLICA_MAX_ATTEMPTS"))
    if permanent or placement.failures >= max_attempts:
        placement.retry_at = None
        placement.reason = f"{reason} (not retried)" if permanent else f"{reason} (gave up after {placement.failures})"
    else:
        placement.retry_at = timezone.now() + dt.timedelta(seconds=conf.retry_delay(placement.failures))
        placement.reason = f"{reason} (attempt {placement.failures} of {max_attempts})"
    placement.save()
    log.warning("adapter placement failed", extra={"placement": placement.pk, "adapter": placement.adapter_id,
                                                   "kind": placement.error_kind, "reason": placement.reason})


def adapter_refresh_status(*, adapter: Adapter) -> None:
    """ready if any placement serves it; failed if every placement failed for good; else pending.

    A failed adapter's `reason` is a fixed sentence picked by the error kind: the worker's words can
    name its file system, so they go to `reason_detail` (admin) and the logs only."""
    if adapter.status == AdapterStatus.DELETING:
        if not adapter.placements.exists():
            adapter.delete()
        return
    placements = list(adapter.placements.all())
    detail = adapter.reason_detail
    if any(p.status == PlacementStatus.READY for p in placements):
        status, reason, detail = AdapterStatus.READY, "", ""
    elif placements and all(p.status == PlacementStatus.FAILED and p.retry_at is None for p in placements):
        status, reason = AdapterStatus.FAILED, adapter_store.public_reason(placements[0].error_kind)
        detail = placements[0].reason
    else:
        status, reason = AdapterStatus.PENDING, adapter.reason if adapter.status == AdapterStatus.PENDING else ""
    if (status, reason, detail) != (adapter.status, adapter.reason, adapter.reason_detail):
        adapter.status, adapter.reason, adapter.reason_detail = status, reason, detail
        adapter.save(update_fields=["status", "reason", "reason_detail", "updated_at"])
