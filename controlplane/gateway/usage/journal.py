"""The usage journal's writes (models.InflightRequest): admit before the first byte, forget with the ledger row.

The request path admits through the usage writer (usage_writer.admit: one INSERT, group-committed
by its thread with the other rows queued at the same time, or spooled while the database is away);
`usage_writer.move` follows only when that worker fails to connect and another is tried. This module
is the database side the writer and the spool's replay call. `forget` runs inside the transaction that
writes the ledger rows (usage_writer.py, usage_queue.py), so a request is either in the journal or
in the ledger, never in neither; a crash between the two leaves it in both, which the sweeper's
idempotent ingest (first write wins) and the limiter's idempotent settle turn into one bill.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from common.asyncdb import db_call
from controlplane.gateway.models import InflightRequest


@dataclass(frozen=True, slots=True)
class Admission:
    request_id: str
    tenant_id: int
    api_key_id: int | None
    model: str
    adapter: str | None
    tier: str
    prompt_estimate: int
    reserved_tokens: int
    reserved_spend_nano: int
    period_start: dt.date
    worker_url: str
    created_at: dt.datetime
    batch_id: str = ""  # a batch line's batch: the sweeper bills it on the batch price line too
    embeddings: bool = False  # a /v1/embeddings request: the sweeper bills it on the embeddings price line
    batch_line: str = ""  # a batch line's ledger identity: what the sweeper bills is the line's one row


def insert(admissions: list[Admission], *, ignore_conflicts: bool = False) -> None:
    """Write journal rows (the usage writer's thread, inside its batch transaction; a spool replay
    with `ignore_conflicts`, since a replay may be a second one)."""
    if not admissions:
        return
    rows = []
    for admission in admissions:
        fields = {name: getattr(admission, name) for name in Admission.__slots__}
        fields["adapter"] = admission.adapter or ""
        rows.append(InflightRequest(**fields))
    InflightRequest.objects.bulk_create(rows, ignore_conflicts=ignore_conflicts)


def move_sync(request_id: str, worker_url: str) -> None:
    InflightRequest.objects.filter(request_id=request_id).update(worker_url=worker_url)


def forget(request_ids: Iterable[str]) -> int:
    """Delete the journal rows of requests whose usage is now in the ledger (call inside its transaction)."""
    ids = list(request_ids)
    if not ids:
        return 0
    # A row whose settlement failed stays (usage written or not) until the sweeper settles it.
    deleted, _ = InflightRequest.objects.filter(request_id__in=ids, unsettled_prompt_tokens__isnull=True).delete()
    return deleted


async def forget_async(request_ids: Iterable[str]) -> int:
    return await db_call(forget, list(request_ids))


def mark_unsettled_sync(request_id: str, prompt: int, cached: int, completion: int) -> int:
    return InflightRequest.objects.filter(request_id=request_id).update(
        unsettled_prompt_tokens=prompt, unsettled_cached_tokens=cached, unsettled_completion_tokens=completion)
