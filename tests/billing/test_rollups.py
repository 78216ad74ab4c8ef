"""Daily roll-ups per tenant, model and key: rebuilt from the ledger, idempotent, exact."""

from datetime import UTC, date, datetime

import pytest

from billing import services, tasks
from billing.models import UsageDaily, UsageRecord
from billing.money import exact_sum

pytestmark = pytest.mark.django_db
DAY = date(2026, 11, 10)


def test_rollup_matches_the_ledger(make_price, make_event, ingest, tenant, api_key, make_tenant):
    make_price(inp="1", end=datetime(2026, 11, 10, 12, tzinfo=UTC))
    make_price(inp="2", start=datetime(2026, 11, 10, 12, tzinfo=UTC))  # a price change inside the day
    other = make_tenant()
    for hour in range(24):
        ingest(make_event(created_at=datetime(2026, 11, 10, hour, tzinfo=UTC), prompt_tokens=1000 + hour))
        ingest(make_event(created_at=datetime(2026, 11, 10, hour, 30, tzinfo=UTC), api_key_id=None))
        ingest(make_event(created_at=datetime(2026, 11, 10, hour, tzinfo=UTC), tenant_id=other.pk, api_key_id=None))
    ingest(make_event(created_at=datetime(2026, 11, 11, 0, tzinfo=UTC)))  # the next day
    assert services.usage_daily_rebuild(day=DAY) == 3  # (tenant, key), (tenant, no key), (other, no key)
    mine = UsageDaily.objects.get(tenant=tenant, api_key=api_key)
    records = UsageRecord.objects.filter(tenant=tenant, api_key=api_key, created_at__date=DAY)
    assert mine.requests == 24 and mine.api_key_prefix == api_key.prefix
    assert mine.prompt_tokens == sum(r.prompt_tokens for r in records)
    assert mine.amount == exact_sum(r.amount for r in records)
    assert exact_sum(UsageDaily.objects.values_list("amount", flat=True)) == exact_sum(
        UsageRecord.objects.filter(created_at__date=DAY).values_list("amount", flat=True)
    )


def test_rebuild_is_idempotent_and_folds_in_late_events(price, make_event, ingest, tenant):
    ingest(make_event(created_at=datetime(2026, 11, 10, 1, tzinfo=UTC)))
    services.usage_daily_rebuild(day=DAY)
    services.usage_daily_rebuild(day=DAY)
    assert UsageDaily.objects.get().requests == 1
    ingest(make_event(created_at=datetime(2026, 11, 10, 2, tzinfo=UTC)))  # arrives late
    tasks.usage_daily_rollup("2026-11-10")
    assert UsageDaily.objects.get().requests == 2


def test_empty_day_clears_old_rollups(price, make_event, ingest):
    record = ingest(make_event(created_at=datetime(2026, 11, 10, 1, tzinfo=UTC)))
    services.usage_daily_rebuild(day=DAY)
    UsageRecord.objects.filter(pk=record.pk).update(created_at=datetime(2026, 11, 9, tzinfo=UTC))
    assert services.usage_daily_rebuild(day=DAY) == 0 and UsageDaily.objects.count() == 0
