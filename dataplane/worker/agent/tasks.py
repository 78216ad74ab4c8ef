"""The worker-side Celery tasks, run inside the data-plane worker process on its queue `worker.<id>`.

Each takes ids (replica or placement id, attempt), reads the current spec back from the control
plane, checks it is still wanted and still this attempt, acts on this process's engine, and
reports the outcome. They are idempotent: a duplicate message finds the work done (the engine
already serves that replica) and only reports again; a stale one (an older attempt, a replica
now stopping or gone) does nothing. `acks_late`, so a message is only gone once handled; bounded
retries with backoff when the control plane cannot be reached. A load that fails is reported as
failed with its reason (and whether retrying can help); the reconciler decides about retries,
so a bad source is never hammered.
"""

from __future__ import annotations

import logging
from collections import Counter

from celery import Celery
from celery.app.amqp import AMQP
from kombu import Connection

import fsbroker

from .client import ControlPlaneClient, ControlPlaneUnavailable, Gone
from .slot import EngineSlot, LoadError

log = logging.getLogger("tessera.worker.agent")

RECONNECT_MAX_SECONDS = 5.0


class QuickReconnectConnection(Connection):
    """Reconnect attempts at most 5 s apart (kombu's grow to 30 s): after a broker outage this worker takes
    its loads within seconds of the broker's return, not up to 30 s later (as controlplane/celery.py)."""

    def ensure_connection(self, errback=None, max_retries=None, interval_start=1, interval_step=1,
                          interval_max=RECONNECT_MAX_SECONDS, *args, **kwargs):
        return super().ensure_connection(errback, max_retries, interval_start, interval_step,
                                         min(interval_max, RECONNECT_MAX_SECONDS), *args, **kwargs)


class QuickReconnectAMQP(AMQP):
    Connection = QuickReconnectConnection


# Not the current app: in a process that also runs the control plane (the local stack, the tests) the
# control plane's @shared_task proxies must keep resolving to its own app.
fsbroker.install()  # `filesystem://`: kombu's transport with messages that appear whole (make run's broker)
app = Celery("tessera-worker-agent", set_as_current=False,  # configured by Agent.start (broker, queue)
             amqp=QuickReconnectAMQP)

RETRY = {"bind": True, "acks_late": True, "ignore_result": True, "autoretry_for": (ControlPlaneUnavailable,),
         "retry_backoff": 2, "retry_backoff_max": 60, "retry_jitter": True, "max_retries": 5}


class TaskRunner:
    """What the tasks do; separate from Celery so it can be driven directly in tests."""

    def __init__(self, client: ControlPlaneClient, slot: EngineSlot) -> None:
        self.client = client
        self.slot = slot
        self.received: Counter[str] = Counter()
        # A failed load reported again (a report retry) must not load again: remembered per attempt.
        self._failed: dict[tuple[str, int], LoadError] = {}

    def load_model(self, replica_id: int, attempt: int) -> str:
        self.received["load_model"] += 1
        try:
            spec = self.client.replica(replica_id)
        except Gone:
            return "skipped: replica gone"
        if spec["attempt"] != attempt:
            return f"skipped: attempt {attempt} is stale (now {spec['attempt']})"
        if spec["status"] not in ("loading", "ready"):
            return f"skipped: replica is {spec['status']}"
        key = (spec["uid"], attempt)
        error = self._failed.get(key)
        if error is None:
            try:
                outcome = self.slot.ensure_model(spec)
            except LoadError as exc:
                error = self._failed[key] = exc
                log.warning("model load failed", extra={"replica": replica_id, "attempt": attempt,
                                                        "reason": exc.reason, "permanent": exc.permanent})
        if error is not None:
            self.client.report_replica(replica_id, {"attempt": attempt, "status": "failed", "reason": error.reason,
                                                    "permanent": error.permanent, "gate": error.gate})
            return "failed"
        loaded = self.slot.loaded
        self.client.report_replica(replica_id, {
            "attempt": attempt, "status": "ready", "load_seconds": loaded.load_seconds if loaded else None,
            "gate": loaded.gate if loaded else None, "load_curve": loaded.load_curve if loaded else None})
        return outcome

    def unload_model(self, replica_id: int, attempt: int) -> str:
        self.received["unload_model"] += 1
        try:
            spec = self.client.replica(replica_id)
        except Gone:
            return "skipped: replica gone"
        if spec["status"] != "stopping":
            return f"skipped: replica is {spec['status']}"
        unloaded = self.slot.unload(spec["uid"])
        self.client.report_replica(replica_id, {"attempt": spec["attempt"], "status": "stopped"})
        return "unloaded" if unloaded else "not loaded"

    def load_adapter(self, placement_id: int, attempt: int) -> str:
        self.received["load_adapter"] += 1
        try:
            spec = self.client.placement(placement_id)
        except Gone:
            return "skipped: placement gone"
        if spec["attempt"] != attempt or spec["status"] not in ("loading", "ready"):
            return "skipped: stale"
        loaded = self.slot.loaded
        try:
            if loaded is None or loaded.replica_uid != spec["replica_uid"]:
                raise LoadError("this worker no longer serves the replica the adapter was placed on", permanent=False)
            outcome = self.slot.add_adapter(spec["adapter"], spec["source"], spec.get("tenant"))
        except LoadError as exc:
            log.warning("adapter load failed", extra={"placement": placement_id, "attempt": attempt,
                                                      "reason": exc.reason, "kind": exc.kind})
            self.client.report_placement(placement_id, {"attempt": attempt, "status": "failed", "reason": exc.reason,
                                                        "permanent": exc.permanent, "kind": exc.kind})
            return "failed"
        self.client.report_placement(placement_id, {"attempt": attempt, "status": "ready"})
        return outcome

    def unload_adapter(self, placement_id: int, attempt: int) -> str:
        self.received["unload_adapter"] += 1
        try:
            spec = self.client.placement(placement_id)
        except Gone:
            return "skipped: placement gone"
        if spec["status"] != "stopping":
            return f"skipped: placement is {spec['status']}"
        removed = self.slot.remove_adapter(spec["adapter"])
        self.client.report_placement(placement_id, {"attempt": spec["attempt"], "status": "stopped"})
        return "unloaded" if removed else "not loaded"


_runner: TaskRunner | None = None


def install(runner: TaskRunner | None) -> None:
    global _runner
    _runner = runner


def runner() -> TaskRunner:
    if _runner is None:
        raise RuntimeError("the worker agent is not running in this process")
    return _runner


@app.task(name="deployments.load_model", **RETRY)
def load_model(self, replica_id: int, attempt: int) -> str:
    return runner().load_model(replica_id, attempt)


@app.task(name="deployments.unload_model", **RETRY)
def unload_model(self, replica_id: int, attempt: int) -> str:
    return runner().unload_model(replica_id, attempt)


@app.task(name="deployments.load_adapter", **RETRY)
def load_adapter(self, placement_id: int, attempt: int) -> str:
    return runner().load_adapter(placement_id, attempt)


@app.task(name="deployments.unload_adapter", **RETRY)
def unload_adapter(self, placement_id: int, attempt: int) -> str:
    return runner().unload_adapter(placement_id, attempt)
