"""The cost of each replica-hour and of each request in it, rebuilt from spans, rates and the ledger.

Not computed when usage is written: a request's share depends on everything else its replica served
in the hour and on how much of the hour was idle, which is known only once the hour is over (and
once late usage, swept or replayed from a gateway's spool, has reached the ledger). So an hour is
rebuilt as a whole, delete + insert in one transaction, as often as needed (idempotent): the beat
task rebuilds the last hours, `manage.py unit_economics --rebuild` any month. Usage keeps arriving
by the ledger's exactly-once path (it carries the worker that served it), so a rebuild after an
outage costs every request exactly once, like the ledger bills it.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction

from billing.costs.attribute import RequestWork, Speeds, kind_of, replica_hour_split
from billing.errors import BillingError
from billing.models import ReplicaHourCost, ReplicaSpan, RequestCost, UsageRecord
from billing.services.worker_rates import worker_rate_at

HOUR = timedelta(hours=1)
_USAGE_FIELDS = ("id", "tenant_id", "model", "adapter", "tier", "batch_id", "embeddings", "worker_url", "created_at",
                 "prompt_tokens", "cached_tokens", "completion_tokens")


@dataclass(frozen=True, slots=True)
class HourRebuilt:
    hour: datetime
    replica_hours: int  # ReplicaHourCost rows written
    requests: int  # RequestCost rows written
    unattributed: int  # usage in the hour that names no known replica (no worker, or before any span)
    unrated: int  # replica-hours of a class with no rate (costed at zero)


def _seconds(delta: timedelta) -> Decimal:
    """A timedelta as exact decimal seconds (microseconds kept)."""
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds).scaleb(-6)


def hour_start(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise BillingError("hour must be timezone-aware")
    value = value.astimezone(UTC)
    if (value.minute, value.second, value.microsecond) != (0, 0, 0):
        raise BillingError(f"hour must be on the hour, got {value.isoformat()}")
    return value


def _span_of(spans_by_url: dict[str, list[ReplicaSpan]], url: str, at: datetime) -> ReplicaSpan | None:
    """The span of `url` that started last at or before `at`: the replica the worker ran then."""
    spans = spans_by_url.get(url)
    if not spans:
        return None
    i = bisect.bisect_right([s.started_at for s in spans], at)
    return spans[i - 1] if i else None


def cost_hour_rebuild(*, hour: datetime) -> HourRebuilt:
    """Recompute the cost rows of the UTC hour starting at `hour` (delete + insert, one transaction)."""
    start = hour_start(hour)
    end = start + HOUR
    default_currency = getattr(settings, "BILLING_DEFAULT_CURRENCY", "usd")
    with transaction.atomic():
        usage = list(UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
                     .order_by("created_at", "id").values(*_USAGE_FIELDS))
        urls = {row["worker_url"] for row in usage if row["worker_url"]}
        spans_by_url: dict[str, list[ReplicaSpan]] = defaultdict(list)
        for span in ReplicaSpan.objects.filter(worker_url__in=urls, started_at__lt=end).order_by("started_at"):
            spans_by_url[span.worker_url].append(span)
        served: dict[int, list[dict]] = defaultdict(list)
        spans = {s.pk: s for s in ReplicaSpan.objects.filter(started_at__lt=end, last_seen_at__gt=start)}
        unattributed = 0
        for row in usage:
            span = _span_of(spans_by_url, row["worker_url"], row["created_at"])
            if span is None:
                unattributed += 1
                continue
            spans.setdefault(span.pk, span)  # a request after its span's last sight: up 0 this hour, cost 0
            served[span.pk].append(row)
        ReplicaHourCost.objects.filter(hour=start).delete()  # cascades to the hour's RequestCost rows
        written = unrated = 0
        for span in sorted(spans.values(), key=lambda s: s.pk):
            rows = served.get(span.pk, [])
            up = max(min(span.last_seen_at, end) - max(span.started_at, start), timedelta(0))
            rate = worker_rate_at(worker_class=span.worker_class, at=start)
            split = replica_hour_split(
                up_seconds=_seconds(up), hourly_cost=rate.hourly_cost if rate else None,
                speeds=Speeds(rate.prefill_tokens_per_second, rate.decode_tokens_per_second) if rate else None,
                requests=[RequestWork(r["id"], r["prompt_tokens"] - r["cached_tokens"], r["completion_tokens"])
                          for r in rows],
            )
            currency = rate.currency if rate else default_currency
            unrated += rate is None
            replica_hour = ReplicaHourCost.objects.create(
                span=span, hour=start, deployment=span.deployment, worker_class=span.worker_class, rate=rate,
                unrated=rate is None, currency=currency, up_seconds=split.up_seconds,
                busy_seconds=split.busy_seconds, work_seconds=split.work_seconds, requests=len(rows),
                total_cost=split.total_cost, attributed_cost=split.attributed_cost, idle_cost=split.idle_cost,
            )
            RequestCost.objects.bulk_create([
                RequestCost(
                    usage_id=row["id"], replica_hour=replica_hour, hour=start, tenant_id=row["tenant_id"],
                    model=row["model"], adapter=row["adapter"], tier=row["tier"],
                    kind=kind_of(batch_id=row["batch_id"], embeddings=row["embeddings"]),
                    deployment=span.deployment, worker_class=span.worker_class, currency=currency,
                    prefill_seconds=share.prefill_seconds, decode_seconds=share.decode_seconds, cost=share.cost,
                    input_cost=share.input_cost, output_cost=share.output_cost,
                )
                for row, share in zip(rows, split.shares, strict=True)
            ])
            written += len(rows)
    return HourRebuilt(start, len(spans), written, unattributed, unrated)


def cost_hours_rebuild(*, start: datetime, end: datetime) -> list[HourRebuilt]:
    """Rebuild every hour in [start, end) (each in its own transaction)."""
    hour = hour_start(start.replace(minute=0, second=0, microsecond=0))
    done = []
    while hour < end:
        done.append(cost_hour_rebuild(hour=hour))
        hour += HOUR
    return done
