"""Rounding and exactness of money arithmetic (no database)."""

from decimal import Decimal

import pytest

from billing.money import exact_sum, round_money, rounding_rule, to_minor_units, token_cost

D = Decimal


def test_token_cost_is_exact_to_16_places():
    assert token_cost(1, D("0.0000000001")) == D("0.0000000000000001")
    assert token_cost(3, D("0.15")) == D("0.00000045")
    # a large month at a price with all 10 places: no digit lost to the default 28-digit context
    exact = D(f"{987_654_321_987 * 12_345_678_912_345_678}e-16")  # integer arithmetic, exact constructor
    assert token_cost(987_654_321_987, D("1234567.8912345678")) == exact
    assert D(987_654_321_987) * D("1234567.8912345678") / 1_000_000 != exact  # what the default context would do


def test_token_cost_refuses_negative_tokens():
    with pytest.raises(ValueError):
        token_cost(-1, D("1"))


@pytest.mark.parametrize(
    ("exact", "half_up", "half_even"),
    [
        (D("0.005"), D("0.01"), D("0.00")),
        (D("0.015"), D("0.02"), D("0.02")),
        (D("0.025"), D("0.03"), D("0.02")),
        (D("0.0049999999999999"), D("0.00"), D("0.00")),
        (D("0.0050000000000001"), D("0.01"), D("0.01")),
        (D("-0.005"), D("-0.01"), D("-0.00")),  # half-up rounds away from zero, like Stripe
        (D("1234567.895"), D("1234567.90"), D("1234567.90")),
        (D("0"), D("0.00"), D("0.00")),
    ],
)
def test_rounding_rules_per_line(exact, half_up, half_even):
    assert round_money(exact, "ROUND_HALF_UP") == half_up
    assert round_money(exact, "ROUND_HALF_EVEN") == half_even


def test_rounding_rule_from_settings(settings):
    assert rounding_rule() == "ROUND_HALF_UP"  # the documented default
    settings.BILLING_ROUNDING = "ROUND_HALF_EVEN"
    assert round_money(D("0.125")) == D("0.12")
    settings.BILLING_ROUNDING = "ROUND_UP"
    with pytest.raises(ValueError, match="BILLING_ROUNDING"):
        rounding_rule()


def test_per_line_rounding_differs_from_rounding_the_sum():
    # Three lines of half a cent each: per-line half-up bills 0.03, rounding the sum would bill 0.02.
    lines = [D("0.005")] * 3
    assert exact_sum(round_money(x, "ROUND_HALF_UP") for x in lines) == D("0.03")
    assert round_money(exact_sum(lines), "ROUND_HALF_UP") == D("0.02")


def test_minor_units():
    assert to_minor_units(D("12.34"), "usd") == 1234
    assert to_minor_units(D("-0.50"), "EUR") == -50
    with pytest.raises(ValueError, match="not rounded"):
        to_minor_units(D("0.001"), "usd")
    with pytest.raises(ValueError, match="zero-decimal"):
        to_minor_units(D("100"), "jpy")


def test_exact_sum_keeps_every_digit():
    values = [D("1000000000000.0000000000000001")] * 3
    assert exact_sum(values) == D("3000000000000.0000000000000003")
