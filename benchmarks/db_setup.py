"""What the benchmarks do to the database of the stack they start, as functions.

Each runs in a child process with that stack's environment (its DATABASE_URL, settings, var
directory), never in the benchmark's own process, which does not set Django up:
`benchmarks.common.db_step(env, "tier_tenants", model=..., tiers=...)` runs
`python -m benchmarks.db_step tier_tenants '<keyword arguments as JSON>'`, which sets Django up,
calls the function of that name here and prints its result as JSON.

Imports models, so importable only once Django is set up (benchmarks/db_step.py does that first).
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import time

from django.core.management import call_command

from billing.models import UsageRecord
from billing.services.prices import price_create
from controlplane.batches.runner import run
from tenants import services


def migrate_and_price(model: str) -> None:
    """The database migrated and `model` priced like production (so metering prices every request;
    unpriced usage logs an error each)."""
    call_command("migrate", verbosity=0)
    price_create(model=model, input_per_mtok=decimal.Decimal("0.10"), cached_input_per_mtok=decimal.Decimal("0.05"),
                 output_per_mtok=decimal.Decimal("0.40"), effective_from=datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))


def tier_tenants(*, model: str, tiers: list[list]) -> dict[str, str]:
    """benchmarks.load: a tier per (name, priority, TTFT p95 ms, ITL p95 ms) and a tenant on it; keys by name."""
    migrate_and_price(model)
    keys = {}
    for name, priority, ttft, itl in tiers:
        tier = services.tier_create(name="load-" + name, priority=priority, slo_ttft_p95_ms=ttft, slo_itl_p95_ms=itl)
        _, created = services.tenant_create_with_key(name="Load " + name, tier=tier)
        keys[name] = created.secret
    return keys


def impact_tenants(*, model: str, premium: list) -> dict[str, str]:
    """benchmarks.batch_impact: a premium tenant (priority and targets of `premium`) and a bulk one."""
    migrate_and_price(model)
    _, priority, ttft, itl = premium
    keys = {}
    tier = services.tier_create(name="impact-premium", priority=priority, slo_ttft_p95_ms=ttft, slo_itl_p95_ms=itl)
    keys["premium"] = services.tenant_create_with_key(name="Premium", tier=tier)[1].secret
    bulk = services.tier_create(name="impact-bulk", priority=20)
    keys["batch"] = services.tenant_create_with_key(name="Bulk", tier=bulk)[1].secret
    return keys


def gateway_tenants(*, model: str) -> dict[str, str]:
    """benchmarks.gateway: an unlimited bench tenant and a free-tier one allowed 2 requests a minute."""
    migrate_and_price(model)
    tier = services.tier_create(name="bench", priority=0)
    _, created = services.tenant_create_with_key(name="Bench", tier=tier)
    free = services.tier_create(name="bench-free", priority=30, requests_per_minute=2)
    _, free_key = services.tenant_create_with_key(name="Free", tier=free)
    return {"bench": created.secret, "free": free_key.secret}


def routing_tenants(*, model: str, names: list[str], tenants: int) -> dict[str, list[str]]:
    """benchmarks.routing_gateways: `tenants` tenants (own salt, own key) per pass name on an unlimited tier."""
    migrate_and_price(model)
    tier = services.tier_create(name="bench", priority=0)
    return {name: [services.tenant_create_with_key(name=f"{name}-{t}", tier=tier)[1].secret for t in range(tenants)]
            for name in names}


def ledger_rows() -> int:
    return UsageRecord.objects.count()


def run_batch(*, batch_id: str) -> dict:
    """A Batch API batch through the runner a Celery worker would call: its status and the runner's seconds."""
    started = time.perf_counter()
    status = asyncio.run(run(batch_id))
    return {"status": status, "seconds": time.perf_counter() - started}
