"""Control-plane tasks. The worker-side tasks (load_model, ...) live in dataplane/worker/agent/tasks.py."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import InterfaceError, OperationalError, close_old_connections

from . import reconciler
from .outage_log import OutageLog

DATABASE = OutageLog(logging.getLogger("tessera.deployments"), "the database (reconciler)")


@shared_task(name="deployments.reconcile", acks_late=False, ignore_result=True)
def reconcile() -> dict:
    """One pass of desired versus actual (idempotent; beat runs it every TESSERA_RECONCILE_SECONDS).

    No retries: a pass that cannot reach the database is simply the pass that did not happen, and
    beat sends the next one within seconds. (Retrying each tick's pass with backoff stacked several
    failing passes per tick and logged a traceback for each.) Acknowledged on receipt, unlike the
    other tasks: a lost pass costs nothing, and an unacknowledged message at the moment a Redis broker
    drops can crash the Celery worker (kombu restores it over a connection already gone).
    """
    try:
        result = reconciler.reconcile().as_dict()
    except (OperationalError, InterfaceError) as exc:
        DATABASE.failed(exc)
        close_old_connections()  # the next pass opens a fresh connection rather than reuse a dead one
        return {"skipped": True, "error": type(exc).__name__}
    DATABASE.succeeded()
    return result
