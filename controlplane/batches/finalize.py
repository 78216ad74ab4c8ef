"""A batch's end: its output file (a line per answered request) and error file (a line per failed
one, with its custom_id), then its terminal status. Idempotent: the files' ids derive from the
batch's, so a finalize interrupted and run again stores each file once."""

from __future__ import annotations

import orjson
from django.db import transaction
from django.utils import timezone

from . import files
from .models import Batch, BatchLine
from .services import TERMINAL

UNANSWERED = {
    Batch.Status.CANCELLING: ("batch_cancelled", "The batch was cancelled before this request was run."),
    Batch.Status.EXPIRED: ("batch_expired", "The batch's completion window passed before this request was run."),
}


def _record(line: BatchLine) -> dict:
    response = None
    if line.status_code is not None:
        response = {"status_code": line.status_code, "request_id": line.request_id, "body": line.response}
    return {"id": f"batch_req_{line.batch_id[6:]}_{line.line_no}", "custom_id": line.custom_id,
            "response": response, "error": line.error if line.state == BatchLine.State.FAILED else None}


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
        ok, failed = [], []
        for line in batch.lines.order_by("line_no"):
            (ok if line.state == BatchLine.State.SUCCEEDED else failed).append(_record(line))
        for records, suffix, field in ((ok, "o", "output_file_id"), (failed, "e", "error_file_id")):
            if records:
                data = b"".join(orjson.dumps(r) + b"\n" for r in records)
                stored = files.output_file_create(
                    tenant_id=batch.tenant_id, file_id=f"file-{batch.id[6:28]}{suffix}{suffix}",
                    filename=f"{batch.id}_{'output' if suffix == 'o' else 'error'}.jsonl", data=data, lines=len(records))
                setattr(batch, field, stored.id)
        batch.request_completed, batch.request_failed = len(ok), len(failed)
        batch.status = end
        setattr(batch, {Batch.Status.CANCELLED: "cancelled_at", Batch.Status.EXPIRED: "expired_at",
                        Batch.Status.COMPLETED: "completed_at"}[end], now)
        batch.lease_until = None
        batch.save()
    return batch
