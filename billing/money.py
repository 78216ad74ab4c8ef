"""Money arithmetic for the ledger: exact `Decimal` everywhere, one rounding rule, applied once per invoice line.

Prices are per 1M tokens with up to 10 decimal places, so the exact cost of any token count has at most
16 decimal places (10 + the 6 of "per million"). Per-request amounts are stored with those 16 places and
are therefore exact; only an invoice line is rounded, to the cent, with `BILLING_ROUNDING`
(half-up by default, like Stripe). Never a float.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Context, Decimal, localcontext

from django.conf import settings

PER_MILLION_EXPONENT = 6  # prices are quoted per 1,000,000 tokens
PRICE_MAX_DIGITS, PRICE_PLACES = 20, 10  # a rate per 1M tokens
AMOUNT_MAX_DIGITS, AMOUNT_PLACES = 32, 16  # an exact, unrounded amount: PRICE_PLACES + 6
MONEY_MAX_DIGITS, MONEY_PLACES = 20, 2  # an invoice amount, in major units (cents precision)
CENT = Decimal("0.01")
ZERO = Decimal("0")
ROUNDING_RULES = {"ROUND_HALF_UP": ROUND_HALF_UP, "ROUND_HALF_EVEN": ROUND_HALF_EVEN}
# Enough digits that products and sums of 16-place amounts never round (default context has 28).
_EXACT = Context(prec=80)

# Meters: what each token class is called on an invoice line and in Stripe.
METER_INPUT, METER_CACHED_INPUT, METER_OUTPUT = "input", "cached_input", "output"
METERS = (METER_INPUT, METER_CACHED_INPUT, METER_OUTPUT)
# Price field that rates each meter.
METER_RATE_FIELD = {
    METER_INPUT: "input_per_mtok",
    METER_CACHED_INPUT: "cached_input_per_mtok",
    METER_OUTPUT: "output_per_mtok",
}
# Currencies whose minor unit is not 1/100 of the major one; unsupported on purpose (see docs/billing.md).
ZERO_DECIMAL_CURRENCIES = frozenset({"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf",
                                     "ugx", "vnd", "vuv", "xaf", "xof", "xpf"})


def rounding_rule() -> str:
    """The configured rule's name; a typo in settings fails loudly rather than billing differently."""
    name = getattr(settings, "BILLING_ROUNDING", "ROUND_HALF_UP")
    if name not in ROUNDING_RULES:
        raise ValueError(f"BILLING_ROUNDING must be one of {sorted(ROUNDING_RULES)}, got {name!r}")
    return name


def token_cost(tokens: int, rate_per_mtok: Decimal) -> Decimal:
    """Exact cost of `tokens` at `rate_per_mtok` (no rounding: at most 16 decimal places)."""
    if tokens < 0:
        raise ValueError(f"token count must be >= 0, got {tokens}")
    with localcontext(_EXACT):
        return (Decimal(tokens) * rate_per_mtok).scaleb(-PER_MILLION_EXPONENT).quantize(Decimal(1).scaleb(-AMOUNT_PLACES))


def exact_sum(values) -> Decimal:
    """Sum of Decimals without the default context's 28-digit rounding."""
    with localcontext(_EXACT):
        return sum(values, ZERO)


def round_money(amount: Decimal, rule: str | None = None) -> Decimal:
    """Round an exact amount to cents with the one documented rule (per invoice line)."""
    with localcontext(_EXACT):
        return amount.quantize(CENT, rounding=ROUNDING_RULES[rule or rounding_rule()])


def to_minor_units(amount: Decimal, currency: str) -> int:
    """Cents (or pence...) for Stripe. Amounts are already rounded to cents; anything finer is a bug."""
    if currency.lower() in ZERO_DECIMAL_CURRENCIES:
        raise ValueError(f"zero-decimal currency {currency!r} is not supported by the billing ledger")
    cents = amount.scaleb(2)
    if cents != cents.to_integral_value():
        raise ValueError(f"{amount} is not rounded to cents")
    return int(cents)
