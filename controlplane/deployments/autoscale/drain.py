"""Draining a replica the autoscaler removes: out of the routing table first, unloaded once idle.

A plain scale-down (an operator's PATCH) sends `unload_model` at once and relies on the worker's
own grace (TESSERA_UNLOAD_GRACE_SECONDS) for requests in flight. The autoscaler removes replicas
while traffic flows, so it does better: `drain_started_at` takes the replica out of every gateway's
routing table at their next poll (selectors.routing_table), and the reconciler sends the unload
only when the worker's heartbeat, taken after every gateway has polled, says nothing is running or
waiting, or after TESSERA_AUTOSCALE_DRAIN_SECONDS (then the worker's grace still applies). A drain
the autoscaler takes back (load rose again) costs nothing: the replica never stopped serving
requests already on it, and it is routed again at the next poll.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings

from .. import conf
from ..models import Replica, WorkerStatus

log = logging.getLogger("tessera.deployments")

# Past the gateways' poll, a margin for a request already on the wire to reach the worker's queue.
WIRE_MARGIN_SECONDS = 1.0


def drain_start(*, replica: Replica, now: dt.datetime) -> None:
    replica.drain_started_at = now
    replica.reason = "draining: out of the routing table, unloaded once idle"
    replica.save(update_fields=["drain_started_at", "reason", "updated_at"])


def drain_cancel(*, replica: Replica) -> None:
    replica.drain_started_at = None
    replica.reason = "serving again (the drain was taken back)"
    replica.save(update_fields=["drain_started_at", "reason", "updated_at"])


def drained(*, replica: Replica, now: dt.datetime) -> bool:
    """Whether the replica may be unloaded: its worker said it was idle after every gateway stopped
    routing to it, or the drain ran out of patience, or the worker is gone anyway."""
    started = replica.drain_started_at
    worker = replica.worker
    if started is None:
        return False
    if worker is None or worker.status != WorkerStatus.READY:
        return True
    if (now - started).total_seconds() >= conf.get("TESSERA_AUTOSCALE_DRAIN_SECONDS"):
        log.warning("drain timed out; unloading with requests in flight (the worker's grace applies)",
                    extra={"replica": replica.pk, "running": worker.num_running, "waiting": worker.num_waiting})
        return True
    unrouted_at = started + dt.timedelta(seconds=float(settings.TESSERA_WORKER_POLL_SECONDS) + WIRE_MARGIN_SECONDS)
    heard = worker.last_heartbeat_at
    return heard is not None and heard >= unrouted_at and worker.num_running == 0 and worker.num_waiting == 0
