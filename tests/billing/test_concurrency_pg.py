"""Several OS processes, each with its own PostgreSQL connection, ingest the same events at once:
every request is billed exactly once and every process gets the same row back."""

from __future__ import annotations

import multiprocessing
import os
import random
import traceback
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections

from billing.events import UsageEvent

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
PROCESSES = 4
SHARED = 120  # events every process sends
OWN = 10  # events only one process sends
BATCH = 10  # processes line up at a barrier before each batch, so inserts really collide


def _worker(index: int, events: list[UsageEvent], barrier, results) -> None:
    try:
        from billing.services import usage_record_ingest

        connections.close_all()  # never reuse the parent's socket: open our own connection
        got = {}
        for start in range(0, len(events), BATCH):
            barrier.wait(timeout=30)
            for event in events[start : start + BATCH]:
                got[event.request_id] = usage_record_ingest(event=event).pk
        results.put((index, os.getpid(), got, None))
    except Exception:  # noqa: BLE001 - report it to the parent, which fails the test
        results.put((index, os.getpid(), {}, traceback.format_exc()))
    finally:
        connections.close_all()


def test_concurrent_processes_bill_each_request_once(price, tenant, api_key):
    if connection.vendor != "postgresql":
        message = "needs PostgreSQL (the test settings fell back to SQLite)"
        if os.environ.get("TESSERA_REQUIRE_SERVICES") == "1":
            pytest.fail(message + " and TESSERA_REQUIRE_SERVICES=1", pytrace=False)
        pytest.skip(message)
    base = datetime(2026, 11, 10, tzinfo=UTC)

    def event(request_id: str, i: int) -> UsageEvent:
        return UsageEvent(
            request_id=request_id, tenant_id=tenant.pk, api_key_id=api_key.pk, model="llama-8b", adapter=None,
            tier="standard", prompt_tokens=1000 + i, cached_tokens=i % 100, completion_tokens=200 + i,
            ttft_ms=10.0, latency_ms=100.0, status="ok", created_at=base + timedelta(seconds=i),
        )

    shared = [event(f"shared-{i}", i) for i in range(SHARED)]
    plans = []
    for p in range(PROCESSES):
        mine = shared + [event(f"own-{p}-{i}", 1000 + i) for i in range(OWN)]
        random.Random(p).shuffle(mine[SHARED:])  # shared ones in the same order: maximal collisions
        plans.append(mine)

    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    connections.close_all()  # children must not inherit an open connection
    workers = [ctx.Process(target=_worker, args=(p, plans[p], barrier, results)) for p in range(PROCESSES)]
    for w in workers:
        w.start()
    outcomes = [results.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=30)

    errors = [err for *_, err in outcomes if err]
    assert not errors, errors[0]
    assert len({pid for _, pid, _, _ in outcomes}) == PROCESSES  # really separate processes

    from billing.models import UsageRecord

    assert UsageRecord.objects.count() == SHARED + PROCESSES * OWN
    rows = dict(UsageRecord.objects.values_list("request_id", "pk"))
    for _, _, got, _ in outcomes:
        assert all(rows[request_id] == pk for request_id, pk in got.items())  # everyone got the one row
    expected = sum(
        (Decimal(e.prompt_tokens - e.cached_tokens) * Decimal("0.15") + Decimal(e.cached_tokens) * Decimal("0.075")
         + Decimal(e.completion_tokens) * Decimal("0.60")) / 1_000_000
        for e in shared + [ev for plan in plans for ev in plan[SHARED:]]
    )
    from billing.selectors import tenant_spend

    assert tenant_spend(tenant=tenant, start=base, end=base + timedelta(days=1)) == expected
