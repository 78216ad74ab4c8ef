"""The price book: lookup specificity, effective windows, price changes, the gateway's estimate."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.errors import BillingError
from billing.models import Price
from billing.selectors import price_estimate, price_lookup

from .conftest import NOV

pytestmark = pytest.mark.django_db
MID = datetime(2026, 11, 15, tzinfo=UTC)


def lookup(at=MID, model="llama-8b", adapter=None, tier="standard"):
    return price_lookup(model=model, adapter=adapter, tier=tier, at=at)


def test_most_specific_price_wins(make_price):
    base = make_price()
    by_tier = make_price(tier="standard", inp="0.10")
    by_adapter = make_price(adapter="sql-lora", inp="0.20")
    both = make_price(adapter="sql-lora", tier="standard", inp="0.25")
    assert lookup() == by_tier
    assert lookup(tier="free") == base
    assert lookup(adapter="sql-lora", tier="free") == by_adapter
    assert lookup(adapter="sql-lora") == both
    assert lookup(adapter="other-lora", tier="free") == base  # unknown adapter falls back to the base price
    assert lookup(model="unknown") is None


def test_effective_window_is_start_inclusive_end_exclusive(make_price):
    old = make_price(inp="1", end=MID)
    new = make_price(inp="2", start=MID)
    assert lookup(at=MID - timedelta(microseconds=1)) == old
    assert lookup(at=MID) == new
    assert lookup(at=NOV - timedelta(seconds=1)) is None


def test_price_change_closes_the_open_price(make_price):
    old = make_price(inp="1")
    new = make_price(inp="2", start=MID)
    old.refresh_from_db()
    assert old.effective_to == MID and new.effective_to is None
    assert lookup(at=MID - timedelta(days=1)).input_per_mtok == Decimal("1")
    assert lookup(at=MID + timedelta(days=1)).input_per_mtok == Decimal("2")


def test_overlapping_window_is_refused(make_price):
    make_price(inp="1")
    make_price(inp="2", start=MID)
    with pytest.raises(BillingError, match="overlaps"):
        make_price(inp="3", start=MID - timedelta(days=1), end=MID + timedelta(days=1))
    with pytest.raises(BillingError, match="overlaps"):
        make_price(inp="3", start=NOV)  # same start as the closed one
    assert Price.objects.count() == 2


def test_price_validation(make_price):
    with pytest.raises(BillingError, match="decimal places"):
        make_price(inp="0.00000000001")
    with pytest.raises(BillingError, match=">= 0"):
        make_price(out="-1")
    with pytest.raises(BillingError, match="timezone"):
        make_price(start=datetime(2026, 11, 1))
    with pytest.raises(BillingError, match="after"):
        make_price(start=MID, end=NOV)


def test_estimate_is_an_upper_bound(make_price):
    make_price(inp="0.15", cached="0.075", out="0.60")
    estimate = price_estimate(
        model="llama-8b", adapter=None, tier="standard", prompt_tokens=1000, completion_tokens=500, at=MID
    )
    assert estimate == Decimal("0.00015") + Decimal("0.0003")
    assert isinstance(estimate, Decimal)


def test_estimate_for_unpriced_model_is_zero(db):
    assert price_estimate(
        model="nope", adapter=None, tier="free", prompt_tokens=10, completion_tokens=10, at=MID
    ) == Decimal("0")
