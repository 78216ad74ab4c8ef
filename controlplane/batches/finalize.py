"""A batch's end: its output file (a line per answered request) and error file (a line per failed
one, with its custom_id), then its terminal status. The files are written line by line, within the
tenant's storage cap (output.py). Idempotent: the files' ids derive from the batch's, and everything
is one transaction, so a finalize interrupted and run again stores each file once."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from . import conf, files, output
from .models import Batch, BatchLine
from .services import TERMINAL

UNANSWERED = {
    Batch.Status.CANCELLING: ("batch_cancelled", "The batch was cancelled before this request was run."),
    Batch.Status.EXPIRED: ("batch_expired", "The batch's completion window passed before this request was run."),
}


def _written_within_cap(batch: Batch) -> output.Written:
    """The batch's files, the output within what the tenant's cap leaves. They are written before
    the tenant's row is taken (writing gigabytes must not hold up the tenant's uploads), then checked
    again under it; an upload that took the room meanwhile means writing them again, holding it."""
    cap = conf.tenant_max_bytes()
    written = output.write(batch, room=cap - files.tenant_bytes(tenant_id=batch.tenant_id))
    used = files.tenant_bytes(tenant_id=batch.tenant_id, lock=True)
    if used + written.output.bytes <= cap:
        return written
    written.close()
    return output.write(batch, room=cap - used)


def batch_finalize(*, batch_id: str) -> Batch:
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch_id)
        if batch.status in TERMINAL:
            return batch
        now = timezone.now()
        cancelling = batch.status == Batch.Status.CANCELLING
        end = Batch.Status.CANCELLED if cancelling else (
            Batch.Status.EXPIRED if now >= batch.expires_at else Batch.Status.COMPLETED)
        unanswered = UNANSWERED.get(Batch.Status.CANCELLING if cancelling else end)
        if unanswered is not None:
            code, message = unanswered
            batch.lines.filter(state__in=[BatchLine.State.PENDING, BatchLine.State.RUNNING]).update(
                state=BatchLine.State.FAILED, error={"code": code, "message": message})
        batch.finalizing_at = batch.finalizing_at or now
        written = _written_within_cap(batch)
        try:
            output.store(batch, written)
        finally:
            written.close()
        batch.status = end
        setattr(batch, {Batch.Status.CANCELLED: "cancelled_at", Batch.Status.EXPIRED: "expired_at",
                        Batch.Status.COMPLETED: "completed_at"}[end], now)
        batch.lease_until = None
        batch.save()
    return batch
