"""Celery tasks of batches: run one (enqueued on create and cancel) and pick up the stranded (beat).

`batches.run` is idempotent and safe to run twice at once: the batch's lease lets one runner in,
and each line is answered once (lines.py). A Celery worker killed mid-batch leaves the lease to
expire; `batches.resume` (beat, every minute) enqueues every unfinished batch whose lease has
passed, so the batch finishes without anyone asking.
"""

from __future__ import annotations

import asyncio
import logging

from celery import shared_task
from django.db import DatabaseError
from django.db.models import Q
from django.dispatch import receiver
from django.utils import timezone

from . import signals

log = logging.getLogger("tessera.batches")


def enqueue_run(batch_id: str) -> None:
    try:
        batch_run.delay(batch_id)
    except Exception:  # the broker is away: the beat's resume sends it once it is back
        log.warning("could not enqueue a batch; the resume sweep will", exc_info=True, extra={"batch": batch_id})


@receiver(signals.batch_run_wanted, dispatch_uid="batches.tasks.enqueue_run")
def _run_wanted(sender, *, batch_id: str, **kwargs) -> None:
    enqueue_run(batch_id)


@shared_task(name="batches.run", acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=True,
             retry_backoff_max=60, max_retries=10)
def batch_run(batch_id: str) -> str:
    from . import conf
    from .runner import BUSY, run

    status = asyncio.run(run(batch_id))
    if status == BUSY:
        # Its runner may be dead (this is how a killed Celery worker's batch resumes): look again once
        # its lease can have passed. A live runner's batch ends this chain by being finished.
        batch_run.apply_async((batch_id,), countdown=conf.lease_seconds())
    return status


@shared_task(name="batches.resume", acks_late=True)
def batches_resume() -> list[str]:
    from .models import Batch

    live = [Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING, Batch.Status.CANCELLING]
    stranded = list(Batch.objects.filter(status__in=live)
                    .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=timezone.now()))
                    .values_list("pk", flat=True)[:100])
    for batch_id in stranded:
        enqueue_run(batch_id)
    return stranded
