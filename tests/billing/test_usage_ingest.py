"""The usage ledger: one row per request however often the event arrives, priced at write time."""

import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction

from billing.errors import BillingError
from billing.models import UsageRecord
from billing.selectors import tenant_spend

from .conftest import NOV

pytestmark = pytest.mark.django_db
D = Decimal


def test_priced_at_write_time_with_exact_amounts(price, make_event, ingest, api_key):
    record = ingest(make_event(prompt_tokens=1000, cached_tokens=200, completion_tokens=300))
    record.refresh_from_db()
    assert record.price_id == price.pk and record.currency == "usd"
    assert record.input_amount == D("800") * D("0.15") / 1_000_000
    assert record.cached_input_amount == D("200") * D("0.075") / 1_000_000
    assert record.output_amount == D("300") * D("0.60") / 1_000_000
    assert record.amount == record.input_amount + record.cached_input_amount + record.output_amount == D("0.000315")
    assert record.api_key_prefix == api_key.prefix and record.adapter == "" and record.tier == "standard"


def test_duplicate_events_bill_once(price, make_event, ingest):
    event = make_event()
    first = ingest(event)
    again = [ingest(event) for _ in range(5)]
    assert {r.pk for r in again} == {first.pk}
    assert UsageRecord.objects.count() == 1


def test_retry_after_the_callers_transaction_rolled_back_bills_once(price, make_event, ingest):
    """A crash between writing usage and committing: nothing is kept, and the retry writes it once."""
    event = make_event()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            ingest(event)
            raise RuntimeError("gateway died before commit")
    assert UsageRecord.objects.count() == 0
    ingest(event)
    ingest(event)  # and the retry of the retry
    assert UsageRecord.objects.count() == 1


def test_ingest_inside_a_callers_transaction_survives_the_duplicate(price, make_event, ingest):
    event = make_event()
    ingest(event)
    with transaction.atomic():  # the gateway settles its reservation in the same transaction
        record = ingest(event)
        assert record.request_id == event.request_id
    assert UsageRecord.objects.count() == 1


def test_the_unique_index_itself_refuses_a_second_row(price, make_event, ingest):
    record = ingest(make_event())
    fields = {f.attname: getattr(record, f.attname) for f in UsageRecord._meta.concrete_fields if f.name != "id"}
    with pytest.raises(IntegrityError), transaction.atomic():
        UsageRecord.objects.create(**fields)


def test_duplicates_are_answered_by_the_unique_index(price, make_event, ingest, django_assert_max_num_queries):
    event = make_event()
    first = ingest(event)
    # price, key prefix, savepoint, failed insert, rollback to savepoint, release, read the winner
    with django_assert_max_num_queries(7):
        assert ingest(event).pk == first.pk


def test_replay_with_different_counts_keeps_the_first_and_warns(price, make_event, ingest, caplog):
    event = make_event(completion_tokens=300)
    first = ingest(event)
    with caplog.at_level(logging.WARNING, logger="tessera.billing"):
        again = ingest(dataclasses.replace(event, completion_tokens=999))
    assert again.pk == first.pk and again.completion_tokens == 300
    assert "differs" in caplog.text


@pytest.mark.django_db(transaction=True)  # PostgreSQL checks foreign keys at commit: really commit
def test_unknown_tenant_is_an_error_not_a_silent_duplicate(price, make_event, ingest):
    with pytest.raises(IntegrityError):
        ingest(make_event(tenant_id=999_999))
    assert UsageRecord.objects.count() == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cached_tokens": 1001}, "cached_tokens"),
        ({"completion_tokens": -1}, ">= 0"),
        ({"created_at": datetime(2026, 11, 10)}, "timezone-aware"),
        ({"request_id": ""}, "request_id"),
        ({"status": "weird"}, "status"),
    ],
)
def test_invalid_events_are_refused(price, make_event, ingest, fields, message):
    with pytest.raises(BillingError, match=message):
        ingest(make_event(**fields))


def test_price_change_mid_month_prices_each_request_when_it_ran(make_price, make_event, ingest):
    change = datetime(2026, 11, 15, 12, tzinfo=UTC)
    old, new = make_price(inp="1"), make_price(inp="2", start=change)
    before = ingest(make_event(created_at=change - timedelta(microseconds=1), cached_tokens=0, completion_tokens=0))
    after = ingest(make_event(created_at=change, cached_tokens=0, completion_tokens=0))
    assert (before.price_id, before.amount) == (old.pk, D("0.001"))
    assert (after.price_id, after.amount) == (new.pk, D("0.002"))


def test_unpriced_usage_is_recorded_not_lost(make_event, ingest, make_price):
    from billing.services import usage_records_reprice

    record = ingest(make_event(model="mystery"))
    assert record.price_id is None and record.amount == 0
    make_price(model="mystery", inp="1", cached="1", out="1")
    assert usage_records_reprice(start=NOV, end=NOV + timedelta(days=30)) == 1
    record.refresh_from_db()
    assert record.price_id is not None and record.amount == D("0.0013")


def test_tenant_spend(price, make_event, ingest, tenant, make_tenant):
    for day in (1, 2, 30):
        ingest(make_event(created_at=datetime(2026, 11, day, tzinfo=UTC)))
    ingest(make_event(created_at=datetime(2026, 12, 1, tzinfo=UTC)))  # next month
    other = make_tenant()
    ingest(make_event(tenant_id=other.pk, api_key_id=None))
    spend = tenant_spend(tenant=tenant, start=NOV, end=datetime(2026, 12, 1, tzinfo=UTC))
    assert spend == 3 * D("0.000315")
    assert isinstance(spend, Decimal)
    assert tenant_spend(tenant=tenant, start=NOV, end=NOV) == 0


def test_amounts_survive_the_database_exactly(make_price, make_event, ingest):
    """16 decimal places round-trip through the column (PostgreSQL numeric is exact)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite stores decimals with 15 significant digits; PostgreSQL is the ledger of record")
    make_price(inp="1234.5678912345", cached="0.0000000001", out="999.9999999999")
    record = ingest(make_event(prompt_tokens=123_457, cached_tokens=1, completion_tokens=98_765))
    record.refresh_from_db()
    assert record.amount == D("123456") * D("1234.5678912345") / 10**6 + D("1e-16") + D(98_765) * D("999.9999999999") / 10**6
