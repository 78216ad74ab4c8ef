from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta

from django.db import transaction
from django.db.models import Count, Sum

from billing.models import Price, UsageDaily, UsageRecord
from billing.money import METER_CACHED_INPUT, METER_INPUT, METER_OUTPUT
from billing.selectors import exact_amount

ROLLUP_KEYS = ("tenant_id", "api_key_id", "api_key_prefix", "model", "adapter", "currency")
TOKEN_FIELDS = ("prompt_tokens", "cached_tokens", "completion_tokens")


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def usage_daily_rebuild(*, day: date) -> int:
    """Recompute the roll-ups of one UTC day from the ledger (delete + insert in one transaction).

    Idempotent: run it as often as you like; late events are folded in on the next run. Amounts are
    exact (integer token sums per price × rate), so they equal the sum of the records' amounts.
    """
    start, end = day_bounds(day)
    with transaction.atomic():
        rows = (
            UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
            .order_by()
            .values(*ROLLUP_KEYS, "price_id", "embeddings")  # embeddings: their own input rate
            .annotate(requests=Count("id"), **{f: Sum(f) for f in TOKEN_FIELDS})
        )
        prices = Price.objects.in_bulk({row["price_id"] for row in rows if row["price_id"] is not None})
        folded: dict[tuple, dict] = defaultdict(lambda: {"groups": [], "requests": 0, **dict.fromkeys(TOKEN_FIELDS, 0)})
        for row in rows:
            acc = folded[tuple(row[k] for k in ROLLUP_KEYS)]
            for name in ("requests", *TOKEN_FIELDS):
                acc[name] += row[name]
            acc["groups"].append({
                "price_id": row["price_id"],
                "embeddings": row["embeddings"],
                METER_INPUT: row["prompt_tokens"] - row["cached_tokens"],
                METER_CACHED_INPUT: row["cached_tokens"],
                METER_OUTPUT: row["completion_tokens"],
            })
        rollups = [
            UsageDaily(
                day=day,
                **dict(zip(ROLLUP_KEYS, key, strict=True)),
                **{name: acc[name] for name in ("requests", *TOKEN_FIELDS)},
                amount=exact_amount(acc["groups"], prices),
            )
            for key, acc in folded.items()
        ]
        UsageDaily.objects.filter(day=day).delete()
        UsageDaily.objects.bulk_create(rollups)
    return len(rollups)
