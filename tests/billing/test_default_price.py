"""The default list price: a fresh install prices every served model, and the price book still rules."""

import csv
import importlib
import io
import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.apps import apps

from billing.default_price import DEFAULT_LIST_PRICE_NOTE, default_list_price_seed, parse_default_list_price
from billing.errors import BillingError
from billing.models import Price
from billing.selectors import price_lookup

from .conftest import NOV

D = Decimal
AT = datetime(2026, 11, 10, 12, tzinfo=UTC)


@pytest.fixture
def default_price(db, settings):
    settings.BILLING_DEFAULT_LIST_PRICE = "0.10,0.05,0.20"
    price = default_list_price_seed(Price)
    Price.objects.filter(pk=price.pk).update(effective_from=NOV)  # in force for the fixtures' November events
    price.refresh_from_db()
    return price


def test_parse_reads_three_rates_or_nothing():
    assert parse_default_list_price("0.10, 0.05 ,0.20") == {
        "input_per_mtok": D("0.10"), "cached_input_per_mtok": D("0.05"), "output_per_mtok": D("0.20")}
    assert parse_default_list_price("") is None and parse_default_list_price("  ") is None


@pytest.mark.parametrize("text", ["0.1,0.2", "0.1,0.2,0.3,0.4", "a,0.1,0.1", "-1,0,0", "NaN,0,0", "Infinity,0,0",
                                  "0.00000000001,0,0"])
def test_parse_refuses_what_the_price_book_would(text):
    with pytest.raises(BillingError, match="BILLING_DEFAULT_LIST_PRICE"):
        parse_default_list_price(text)


def test_the_migration_seeds_one_named_entry_into_an_empty_book(db, settings):
    settings.BILLING_DEFAULT_LIST_PRICE = "0.10,0.05,0.20"
    settings.BILLING_DEFAULT_CURRENCY = "EUR"
    migration = importlib.import_module("billing.migrations.0004_default_list_price")
    migration.seed(apps, None)
    migration.seed(apps, None)  # a second run adds nothing: the book is no longer empty
    (price,) = Price.objects.all()
    assert (price.model, price.adapter, price.tier, price.currency) == ("*", "", "", "eur")
    assert (price.input_per_mtok, price.cached_input_per_mtok, price.output_per_mtok) == (D("0.1"), D("0.05"), D("0.2"))
    assert price.note == DEFAULT_LIST_PRICE_NOTE and price.effective_to is None


def test_no_seed_when_off_or_when_the_operator_priced_already(db, settings, make_price):
    settings.BILLING_DEFAULT_LIST_PRICE = ""
    assert default_list_price_seed(Price) is None and not Price.objects.exists()
    settings.BILLING_DEFAULT_LIST_PRICE = "1,1,1"
    make_price(model="llama-8b")
    assert default_list_price_seed(Price) is None
    assert list(Price.objects.values_list("model", flat=True)) == ["llama-8b"]


def test_any_model_entry_prices_unnamed_models_only(default_price, make_price):
    assert price_lookup(model="smollm2-135m-instruct", adapter=None, tier="free", at=AT) == default_price
    named = make_price(model="llama-8b", inp="9")
    assert price_lookup(model="llama-8b", adapter=None, tier=None, at=AT) == named
    # A by-name entry wins even over a more specific any-model entry (adapter and tier set).
    make_price(model="*", adapter="sql-lora", tier="free", inp="5")
    assert price_lookup(model="llama-8b", adapter="sql-lora", tier="free", at=AT) == named
    assert price_lookup(model="qwen", adapter="sql-lora", tier="free", at=AT).input_per_mtok == D("5")
    assert price_lookup(model="qwen", adapter=None, tier=None, at=NOV - timedelta(seconds=1)) is None


def test_an_operator_closes_the_default_like_any_price(default_price, make_price):
    make_price(model="*", inp="0.3", cached="0.1", out="0.9", start=NOV + timedelta(days=5))
    default_price.refresh_from_db()
    assert default_price.effective_to == NOV + timedelta(days=5)
    assert price_lookup(model="m", adapter=None, tier=None, at=AT).input_per_mtok == D("0.3")


def test_first_request_is_priced_quietly_and_exported_with_money(default_price, make_event, ingest, caplog, client,
                                                                  make_user):
    with caplog.at_level(logging.WARNING, logger="tessera"):
        record = ingest(make_event(model="smollm2-135m-instruct", prompt_tokens=1000, cached_tokens=0,
                                   completion_tokens=500, created_at=AT))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert record.price_id == default_price.pk and record.amount == D("0.0002")  # 1000 x 0.10 + 500 x 0.20 per 1M
    client.force_login(make_user("fiona", role="finance"))
    response = client.get("/api/v1/billing/exports/usage.csv", {"from": "2026-11-01", "to": "2026-12-01"})
    assert response.status_code == 200
    (row,) = csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    assert (row["model"], D(row["amount"])) == ("smollm2-135m-instruct", D("0.0002"))
