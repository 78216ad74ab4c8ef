"""Celery: the daily retention prune (beat: `audit-prune`)."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

from .retention import audit_events_prune


@shared_task(name="audit.prune", acks_late=True, autoretry_for=(OperationalError, InterfaceError),
             retry_backoff=True, retry_backoff_max=600, max_retries=5)
def prune(days: int | None = None) -> int:
    """Idempotent: a second run finds nothing older than the cutoff."""
    return audit_events_prune(days=days)
