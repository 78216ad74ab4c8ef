"""The usage journal's writes (models.InflightRequest): admit before the first byte, forget with the ledger row.

`admit` runs on the request path, after a worker is picked and before it is sent the request: one
INSERT, group-committed by the usage writer's thread with the other rows queued at the same time
(usage_writer.py); `move` follows only when that worker fails to connect and another is tried. `forget` runs inside the transaction that
writes the ledger rows (usage_writer.py, usage_queue.py), so a request is either in the journal or
in the ledger, never in neither; a crash between the two leaves it in both, which the sweeper's
idempotent ingest (first write wins) and the limiter's idempotent settle turn into one bill.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.asyncdb import db_call


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


def insert(admissions: list[Admission]) -> None:
    """Write journal rows (the usage writer's thread, inside its batch transaction)."""
    from .models import InflightRequest

    if not admissions:
        return
    rows = []
    for admission in admissions:
        fields = {name: getattr(admission, name) for name in Admission.__slots__}
        fields["adapter"] = admission.adapter or ""
        rows.append(InflightRequest(**fields))
    InflightRequest.objects.bulk_create(rows)


async def admit(admission: Admission) -> None:
    """Durable before it returns (group-committed by the process's usage writer with whatever else is
    queued); raises if the database cannot take it (the caller refuses the request)."""
    from . import usage_writer

    await usage_writer.writer_for(_sync_sink()).admit(admission)


def _sync_sink():
    """The configured ledger sink when it is a plain function (its writer thread takes the journal's
    rows too, so one thread writes everything), else None: a writer for journal rows only."""
    import asyncio

    from django.conf import settings
    from django.utils.module_loading import import_string

    try:
        sink = import_string(settings.TESSERA_USAGE_SINK)
    except ImportError:
        return None
    return None if asyncio.iscoroutinefunction(sink) else sink


def _move(request_id: str, worker_url: str) -> None:
    from .models import InflightRequest

    InflightRequest.objects.filter(request_id=request_id).update(worker_url=worker_url)


async def move(request_id: str, worker_url: str) -> None:
    """The request went to another worker (the first failed before accepting it)."""
    await db_call(_move, request_id, worker_url)


def forget(request_ids: Iterable[str]) -> int:
    """Delete the journal rows of requests whose usage is now in the ledger (call inside its transaction)."""
    from .models import InflightRequest

    ids = list(request_ids)
    if not ids:
        return 0
    # A row whose settlement failed stays (usage written or not) until the sweeper settles it.
    deleted, _ = InflightRequest.objects.filter(request_id__in=ids, unsettled_prompt_tokens__isnull=True).delete()
    return deleted


async def forget_async(request_ids: Iterable[str]) -> int:
    return await db_call(forget, list(request_ids))


def _mark_unsettled(request_id: str, prompt: int, cached: int, completion: int) -> int:
    from .models import InflightRequest

    return InflightRequest.objects.filter(request_id=request_id).update(
        unsettled_prompt_tokens=prompt, unsettled_cached_tokens=cached, unsettled_completion_tokens=completion)


async def mark_unsettled(request_id: str, *, prompt: int, cached: int, completion: int) -> int:
    """The limiter could not be settled: keep the row, with the request's final counts, for the sweeper."""
    return await db_call(_mark_unsettled, request_id, prompt, cached, completion)
