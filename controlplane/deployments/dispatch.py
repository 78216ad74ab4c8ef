"""Sending work to workers: Celery messages by task name on each worker's own queue.

The tasks themselves live in the data-plane worker (dataplane/worker/agent/tasks.py), which
consumes only `worker.<name>`; the control plane never imports them, it sends by name. Every
message is sent after the transaction that decided it commits (`transaction.on_commit`), and
carries ids only: the worker reads the current spec back from the internal API, so a message
that arrives late, twice, or after the decision changed does no harm (see the tasks' checks).
A send that fails (broker down) is logged, not raised: the reconciler sends again
(`TESSERA_REPLICA_REDISPATCH_SECONDS`) when the worker does not report the work as started.
"""

from __future__ import annotations

import logging

from django.db import transaction

log = logging.getLogger("tessera.deployments")

LOAD_MODEL = "deployments.load_model"
UNLOAD_MODEL = "deployments.unload_model"
LOAD_ADAPTER = "deployments.load_adapter"
UNLOAD_ADAPTER = "deployments.unload_adapter"
RECONCILE = "deployments.reconcile"


def send(name: str, args: list, queue: str | None = None, expires: float | None = None) -> None:
    """Publish one message now (tests replace this to record messages instead)."""
    from controlplane.celery import app

    options = {"queue": queue} if queue else {}
    if expires is not None:
        options["expires"] = expires
    try:
        app.send_task(name, args=args, retry=True,
                      retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5}, **options)
    except Exception:  # noqa: BLE001 - the reconciler re-sends; the caller's commit already happened
        log.exception("could not publish a task", extra={"task": name, "queue": queue, "task_args": args})


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
