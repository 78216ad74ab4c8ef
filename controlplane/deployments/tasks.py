"""Control-plane tasks. The worker-side tasks (load_model, ...) live in dataplane/worker/agent/tasks.py."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from . import reconciler


@shared_task(name="deployments.reconcile", acks_late=True, ignore_result=True,
             autoretry_for=(OperationalError, InterfaceError), retry_backoff=True, retry_backoff_max=30,
             max_retries=3)
def reconcile() -> dict:
    """One pass of desired versus actual (idempotent; beat runs it every TESSERA_RECONCILE_SECONDS)."""
    return reconciler.reconcile().as_dict()
