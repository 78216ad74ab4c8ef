"""The database side of running a batch: the lease, claiming lines, recording answers.

Billed once by construction: every attempt of a line carries the line's ledger identity
(`line_ledger_key`: its batch and custom_id), on which the ledger is unique (billing's
`UsageRecord.batch_line`), so no second attempt, under whatever request id, can add a second row.

Answered once: a line is claimed (pending → running) with the request id it is sent under, and
answered (running → succeeded/failed) in one UPDATE guarded by that id. A runner that dies leaves
lines `running`; the next runner (once the lease has passed) recovers them: a line already in the
ledger is re-sent under the request id it was billed under (its output line names the ledger's
row), one only in the usage journal is released (its reservation settled to nothing, its row
removed: the client is billed for the answer it gets) and sent again under a new id. A line whose
runner died under it TESSERA_BATCH_LINE_ATTEMPTS times fails instead of taking the next one down.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from . import conf
from .models import Batch, BatchLine


def lease_take(*, batch_id: str) -> tuple[Batch, bool]:
    """(the batch, whether this runner now holds it): not when it is finished or a live runner holds it."""
    now = timezone.now()
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch_id)
        if batch.status not in (Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING, Batch.Status.CANCELLING):
            return batch, False
        if batch.lease_until is not None and batch.lease_until > now:
            return batch, False
        batch.lease_until = now + dt.timedelta(seconds=conf.lease_seconds())
        batch.save(update_fields=["lease_until"])
        return batch, True


def lease_renew(*, batch_id: str, output_bytes: int) -> str:
    """Extend the lease and publish the bytes of the batch's stored answers (the tenant's other batches'
    runners count them against its storage cap, quota.py); the batch's status (the runner stops on
    cancelling)."""
    until = timezone.now() + dt.timedelta(seconds=conf.lease_seconds())
    Batch.objects.filter(pk=batch_id).update(lease_until=until, output_bytes=output_bytes)
    return Batch.objects.values_list("status", flat=True).get(pk=batch_id)


def _line_request_id(line: BatchLine) -> str:
    return f"req_b{line.pk}_{uuid.uuid4().hex[:12]}"


def line_ledger_key(*, batch_id: str, custom_id: str) -> str:
    """The line's identity in the ledger: its batch and custom_id (unique together in a batch), the
    custom_id hashed to bound the length (it may be 512 characters, of any text)."""
    digest = hashlib.sha256(custom_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{batch_id}:{digest}"


def stale_lines(*, batch_id: str) -> list[BatchLine]:
    return list(BatchLine.objects.filter(batch_id=batch_id, state=BatchLine.State.RUNNING))


RUNNER_DIED = {"code": "attempts_exhausted",
               "message": "The batch runner stopped while running this request on each of its tries; "
                          "it is not sent again."}


def line_requeue_stale(*, line_id: int, billed_request_id: str) -> bool:
    """A dead runner's line back to pending (under `billed_request_id` when the ledger has billed it,
    else a new id to come); failed instead once its tries are spent. True when requeued."""
    rows = BatchLine.objects.filter(pk=line_id, state=BatchLine.State.RUNNING)
    if rows.filter(attempts__gte=conf.max_attempts()).update(
            state=BatchLine.State.FAILED, status_code=500, error=RUNNER_DIED,
            response={"error": {**RUNNER_DIED, "type": "server_error", "param": None}}):
        return False
    return bool(rows.update(state=BatchLine.State.PENDING, request_id=billed_request_id))


def line_claim(*, batch_id: str, limit: int) -> list[BatchLine]:
    """Up to `limit` pending lines, now running; each keeps a request id it was given for a billed
    attempt, else gets a new one."""
    now = timezone.now()
    with transaction.atomic():
        rows = list(BatchLine.objects.select_for_update(skip_locked=True)
                    .filter(batch_id=batch_id, state=BatchLine.State.PENDING)
                    .filter(Q(not_before__isnull=True) | Q(not_before__lte=now))
                    .order_by("line_no")[:limit])
        for line in rows:
            line.state = BatchLine.State.RUNNING
            line.attempts += 1
            line.request_id = line.request_id or _line_request_id(line)
        BatchLine.objects.bulk_update(rows, ["state", "attempts", "request_id"])
    return rows


def line_answer(*, line_id: int, request_id: str, ok: bool, status_code: int, body, error: dict | None,
                output_bytes: int = 0) -> bool:
    """Store the attempt's outcome, and with an answer the bytes its output record takes (counted against
    the tenant's storage cap); False when the line is no longer this attempt's (answered already)."""
    return bool(BatchLine.objects.filter(pk=line_id, state=BatchLine.State.RUNNING, request_id=request_id).update(
        state=BatchLine.State.SUCCEEDED if ok else BatchLine.State.FAILED, status_code=status_code, response=body,
        error=error, output_bytes=output_bytes if ok else 0))


def lines_fail_pending(*, batch_id: str, status_code: int, body: dict, error: dict) -> int:
    """Every line not yet sent fails with this error (the batch's key may no longer send)."""
    return BatchLine.objects.filter(batch_id=batch_id, state=BatchLine.State.PENDING).update(
        state=BatchLine.State.FAILED, status_code=status_code, response=body, error=error)


def lines_fail_over_cap(*, batch_id: str, not_run: dict, billed: dict) -> int:
    """Every line not yet sent fails for the tenant's storage cap, with no status and no body (no request
    is made): `not_run` for one never billed, `billed` for one a dead runner's attempt was billed for
    (pending under that attempt's request id, its answer lost with the runner)."""
    pending = BatchLine.objects.filter(batch_id=batch_id, state=BatchLine.State.PENDING)
    failed = {"state": BatchLine.State.FAILED, "status_code": None, "response": None}
    return (pending.exclude(request_id="").update(**failed, error=billed)
            + pending.filter(request_id="").update(**failed, error=not_run))


def line_retry(*, line_id: int, request_id: str, after_seconds: float, count_attempt: bool) -> None:
    """Back to pending under a new request id (this attempt was refused or failed unbilled)."""
    update = {"state": BatchLine.State.PENDING, "request_id": "",
              "not_before": timezone.now() + dt.timedelta(seconds=after_seconds)}
    rows = BatchLine.objects.filter(pk=line_id, state=BatchLine.State.RUNNING, request_id=request_id)
    if not count_attempt:
        update["attempts"] = F("attempts") - 1
    rows.update(**update)


def lines_left(*, batch_id: str) -> int:
    return BatchLine.objects.filter(batch_id=batch_id,
                                    state__in=[BatchLine.State.PENDING, BatchLine.State.RUNNING]).count()


def mark_finalizing(*, batch_id: str) -> None:
    Batch.objects.filter(pk=batch_id, status=Batch.Status.IN_PROGRESS).update(
        status=Batch.Status.FINALIZING, finalizing_at=timezone.now())
