"""Measure the billing paths that scale with traffic, on a throwaway PostgreSQL database.

    python -m billing.bench [--rows 300000] [--events 2000] [--processes 4] [--json FILE]

Creates a fresh test database (migrated), measures, drops it. Prints JSON. What it measures:
ingest latency / throughput (unique and duplicate events, one and several processes), the
gateway's `tenant_spend` over a month, invoice building, daily roll-up, and the streamed CSV /
Parquet exports (throughput and peak Python / Arrow memory, against loading all rows at once).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
import tracemalloc
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.test")

import django  # noqa: E402

django.setup()

import pyarrow as pa  # noqa: E402
from django.db import connection, connections  # noqa: E402

from billing import exports, services  # noqa: E402
from billing.events import UsageEvent  # noqa: E402
from billing.models import Price, UsageRecord  # noqa: E402
from billing.money import exact_sum, token_cost  # noqa: E402
from billing.selectors import tenant_spend  # noqa: E402
from tenants import services as tenant_services  # noqa: E402

MONTH = datetime(2026, 11, 1, tzinfo=UTC)


def _event(tenant_id: int, key_id: int | None, i: int, request_id: str | None = None) -> UsageEvent:
    return UsageEvent(
        request_id=request_id or f"bench-{uuid.uuid4().hex}", tenant_id=tenant_id, api_key_id=key_id, model="llama-8b",
        adapter=None, tier="standard", prompt_tokens=500 + i % 3000, cached_tokens=i % 400, completion_tokens=50 + i % 900,
        ttft_ms=20.0, latency_ms=400.0, status="ok", created_at=MONTH + timedelta(seconds=i * 7),
    )


def _timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return (time.perf_counter() - start) * 1000, result


def _ingest_worker(events, barrier, out) -> None:
    connections.close_all()
    barrier.wait()
    start = time.perf_counter()
    for event in events:
        services.usage_record_ingest(event=event)
    out.put(time.perf_counter() - start)
    connections.close_all()


def bench_ingest(tenant_id: int, key_id: int, events: int, processes: int) -> dict:
    batch = [_event(tenant_id, key_id, i) for i in range(events)]
    latencies = []
    for event in batch:
        ms, _ = _timed(services.usage_record_ingest, event=event)
        latencies.append(ms)
    duplicate = [_timed(services.usage_record_ingest, event=e)[0] for e in batch[: events // 2]]
    shared = [_event(tenant_id, key_id, i) for i in range(events)]
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    connections.close_all()
    start = time.perf_counter()
    workers = [ctx.Process(target=_ingest_worker, args=(shared, barrier, out)) for _ in range(processes)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    billed = UsageRecord.objects.filter(request_id__in=[e.request_id for e in shared]).count()
    latencies.sort()
    return {
        "unique_events": events,
        "ingest_ms_p50": round(statistics.median(latencies), 3),
        "ingest_ms_p99": round(latencies[int(len(latencies) * 0.99) - 1], 3),
        "ingest_per_s_one_process": round(events / (sum(latencies) / 1000)),
        "duplicate_ms_p50": round(statistics.median(duplicate), 3),
        "processes": processes,
        "same_events_from_each_process": events,
        "rows_billed_after_concurrent_run": billed,
        "concurrent_wall_s": round(wall, 2),
        "concurrent_attempts_per_s": round(processes * events / wall),
    }


def seed(tenants: list, price: Price, rows: int) -> None:
    """Bulk rows (not through ingest: the point here is reading a big month)."""
    per = max(1, rows // len(tenants))
    batch = []
    for i in range(rows):
        tenant = tenants[i // per % len(tenants)]
        prompt, cached, completion = 500 + i % 3000, i % 400, 50 + i % 900
        parts = [token_cost(prompt - cached, price.input_per_mtok), token_cost(cached, price.cached_input_per_mtok),
                 token_cost(completion, price.output_per_mtok)]
        batch.append(UsageRecord(
            request_id=f"seed-{i}", tenant=tenant, model="llama-8b", tier="standard", status="ok",
            prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion, latency_ms=1.0,
            created_at=MONTH + timedelta(seconds=(i * 2_591_999) // rows), price=price, currency="usd",
            input_amount=parts[0], cached_input_amount=parts[1], output_amount=parts[2], amount=exact_sum(parts),
        ))
        if len(batch) == 10_000:
            UsageRecord.objects.bulk_create(batch)
            batch = []
    UsageRecord.objects.bulk_create(batch)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE billing_usagerecord")


def _stream_peak(make_chunks) -> tuple[float, int, int, int]:
    """(seconds, peak Python bytes, peak Arrow pool bytes since process start, output bytes)."""
    tracemalloc.start()
    start = time.perf_counter()
    size = 0
    for chunk in make_chunks():
        size += len(chunk)
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return elapsed, peak, pa.default_memory_pool().max_memory(), size


def bench_month(tenants: list, rows: int) -> dict:
    end = MONTH + timedelta(days=30)
    tenant = tenants[0]
    tenant_rows = UsageRecord.objects.filter(tenant=tenant, created_at__gte=MONTH, created_at__lt=end).count()
    spend_ms = sorted(_timed(tenant_spend, tenant=tenant, start=MONTH, end=end)[0] for _ in range(5))
    build_ms, invoice = _timed(services.invoice_draft_build, tenant=tenant, month=date(2026, 11, 1))
    rollup_ms, _ = _timed(services.usage_daily_rebuild, day=date(2026, 11, 10))
    csv_s, csv_peak, _, csv_bytes = _stream_peak(
        lambda: exports.csv_stream(exports.USAGE_COLUMNS, exports.usage_rows(start=MONTH, end=end)))
    pq_s, pq_peak, pq_arrow, pq_bytes = _stream_peak(
        lambda: exports.parquet_stream(exports.USAGE_COLUMNS, exports.usage_rows(start=MONTH, end=end)))
    tracemalloc.start()
    loaded = list(UsageRecord.objects.filter(created_at__gte=MONTH, created_at__lt=end)
                  .values_list(*[p for _, p, _ in exports.USAGE_COLUMNS]))
    _, naive_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del loaded
    return {
        "rows_in_month": rows,
        "rows_of_one_tenant": tenant_rows,
        "tenant_spend_ms_median": round(spend_ms[2], 1),
        "invoice_draft_build_ms": round(build_ms, 1),
        "invoice_total": str(invoice.total),
        "daily_rollup_one_day_ms": round(rollup_ms, 1),
        "csv_rows_per_s": round(rows / csv_s),
        "csv_mb": round(csv_bytes / 1e6, 1),
        "csv_peak_python_mb": round(csv_peak / 1e6, 1),
        "parquet_rows_per_s": round(rows / pq_s),
        "parquet_mb": round(pq_bytes / 1e6, 1),
        "parquet_peak_python_mb": round(pq_peak / 1e6, 1),
        "parquet_peak_arrow_mb": round(pq_arrow / 1e6, 1),
        "load_all_rows_peak_python_mb": round(naive_peak / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("billing.bench needs PostgreSQL")
    db_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        tier = tenant_services.tier_create(name="bench", priority=5)
        tenants = [tenant_services.tenant_create(tier=tier, name=f"Bench {i}") for i in range(20)]
        key = tenant_services.api_key_create(tenant=tenants[0], name="bench").key
        price = services.price_create(
            model="llama-8b", input_per_mtok=Decimal("0.15"), cached_input_per_mtok=Decimal("0.075"),
            output_per_mtok=Decimal("0.6"), effective_from=MONTH - timedelta(days=1),
        )
        results = {"database": "postgresql", "ingest": bench_ingest(tenants[1].pk, key.pk, args.events, args.processes)}
        UsageRecord.objects.all().delete()
        seed_ms, _ = _timed(seed, tenants, price, args.rows)
        results["seed_s"] = round(seed_ms / 1000, 1)
        results["month"] = bench_month(tenants, args.rows)
    finally:
        connections.close_all()
        connection.creation.destroy_test_db(db_name, verbosity=0)
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
