"""Celery tasks of batches: run one (enqueued on create and cancel) and pick up the stranded (beat).

`batches.run` is idempotent and safe to run twice at once: the batch's lease lets one runner in,
and each line is answered once (lines.py). A Celery worker killed mid-batch leaves the lease to
expire; `batches.resume` (beat, every minute) enqueues the unfinished batches whose lease has
passed, oldest first and tenants in turns, so the batch finishes without anyone asking; a batch
still `validating` when its window passes is expired there.
"""

from __future__ import annotations

import asyncio
import logging

from celery import shared_task
from django.db import DatabaseError, DataError
from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber
from django.dispatch import receiver
from django.utils import timezone

from . import conf, signals
from .models import Batch
from .runner import BUSY, run
from .services import batches_expire_validating

log = logging.getLogger("tessera.batches")
RESUME_PER_SWEEP = 100  # batches enqueued by one sweep (a minute apart)


def enqueue_run(batch_id: str) -> None:
    try:
        batch_run.delay(batch_id)
    except Exception:  # the broker is away: the beat's resume sends it once it is back
        log.warning("could not enqueue a batch; the resume sweep will", exc_info=True, extra={"batch": batch_id})


@receiver(signals.batch_run_wanted, dispatch_uid="batches.tasks.enqueue_run")
def _run_wanted(sender, *, batch_id: str, **kwargs) -> None:
    enqueue_run(batch_id)


# A DataError (a value the database refuses) is the same on every try: retrying it only loads the queue.
@shared_task(name="batches.run", acks_late=True, autoretry_for=(DatabaseError,), dont_autoretry_for=(DataError,),
             retry_backoff=True, retry_backoff_max=60, max_retries=10)
def batch_run(batch_id: str) -> str:
    status = asyncio.run(run(batch_id))
    if status == BUSY:
        # Its runner may be dead (this is how a killed Celery worker's batch resumes): look again once
        # its lease can have passed. A live runner's batch ends this chain by being finished.
        batch_run.apply_async((batch_id,), countdown=conf.lease_seconds())
    return status


@shared_task(name="batches.resume", acks_late=True)
def batches_resume() -> list[str]:
    """Expire what has outlived its window while `validating`, then enqueue up to RESUME_PER_SWEEP
    stranded batches, fairly: each tenant's oldest first, the tenants taken in turns (every tenant's
    oldest, then every tenant's second oldest, ...), so that one tenant's many stranded batches cannot
    keep another's from resuming."""
    batches_expire_validating()
    for batch_id in (stranded := stranded_batches(limit=RESUME_PER_SWEEP)):
        enqueue_run(batch_id)
    return stranded


def stranded_batches(*, limit: int) -> list[str]:
    live = [Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING, Batch.Status.CANCELLING]
    turn = Window(RowNumber(), partition_by=[F("tenant_id")], order_by=[F("created_at").asc(), F("id").asc()])
    return list(Batch.objects.filter(status__in=live)
                .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=timezone.now()))
                .annotate(turn=turn).order_by("turn", "created_at", "id")
                .values_list("pk", flat=True)[:limit])
