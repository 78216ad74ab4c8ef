"""Sending work to workers: Celery messages by task name on each worker's own queue.

The tasks themselves live in the data-plane worker (dataplane/worker/agent/tasks.py), which
consumes only `worker.<name>`; the control plane never imports them, it sends by name. Every
message is sent after the transaction that decided it commits (`transaction.on_commit`), and
carries ids only: the worker reads the current spec back from the internal API, so a message
that arrives late, twice, or after the decision changed does no harm (see the tasks' checks).
A send that fails (broker down) is logged, not raised: the decision is already in the database and
the reconciler sends again (`TESSERA_REPLICA_REDISPATCH_SECONDS`, or at once on its first pass after
an outage) when the worker does not report the work as started. The failure is logged as an outage
(outage_log.py): one line when the broker goes, one a minute, one when it is back.
"""

from __future__ import annotations

import logging

from django.db import transaction

from controlplane.celery import app

from .outage_log import OutageLog

log = logging.getLogger("tessera.deployments")
BROKER = OutageLog(log, "the Celery broker")

LOAD_MODEL = "deployments.load_model"
UNLOAD_MODEL = "deployments.unload_model"
LOAD_ADAPTER = "deployments.load_adapter"
UNLOAD_ADAPTER = "deployments.unload_adapter"
RECONCILE = "deployments.reconcile"


def send(name: str, args: list, queue: str | None = None, expires: float | None = None) -> None:
    """Publish one message now (tests replace this to record messages instead)."""
    options = {"queue": queue} if queue else {}
    if expires is not None:
        options["expires"] = expires
    # While this process already knows the broker is away, one quick try: a caller (an API request whose
    # commit queued this) must not wait through retries that the reconciler makes anyway.
    retry = not BROKER.down
    try:
        app.send_task(name, args=args, retry=retry,
                      retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5}, **options)
    except Exception as exc:  # noqa: BLE001 - the reconciler re-sends; the caller's commit already happened
        BROKER.failed(exc, task=name, queue=queue, task_args=args)
    else:
        BROKER.succeeded()


def _on_commit(name: str, args: list, queue: str | None = None, expires: float | None = None) -> None:
    # `send` is looked up at commit time, so a test's replacement applies to messages decided earlier too.
    transaction.on_commit(lambda: send(name, args, queue, expires))


def load_model(*, replica) -> None:
    _on_commit(LOAD_MODEL, [replica.pk, replica.attempt], replica.worker.queue)


def unload_model(*, replica) -> None:
    _on_commit(UNLOAD_MODEL, [replica.pk, replica.attempt], replica.worker.queue)


def load_adapter(*, placement, worker) -> None:
    _on_commit(LOAD_ADAPTER, [placement.pk, placement.attempt], worker.queue)


def unload_adapter(*, placement, worker) -> None:
    _on_commit(UNLOAD_ADAPTER, [placement.pk, placement.attempt], worker.queue)


def reconcile_soon() -> None:
    """Ask for a reconcile pass as soon as this transaction commits (beat runs one anyway)."""
    _on_commit(RECONCILE, [], None, expires=30)
