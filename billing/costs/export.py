"""The unit-economics report as rows for billing/exports.py's CSV and Parquet streams."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import astuple

import pyarrow as pa

from billing.costs.report import UnitEconomics
from billing.models.costs import COST_MAX_DIGITS, COST_PLACES
from billing.money import AMOUNT_MAX_DIGITS, AMOUNT_PLACES

_AMOUNT = pa.decimal128(AMOUNT_MAX_DIGITS, AMOUNT_PLACES)  # revenue and margins: the ledger's exact places
_COST = pa.decimal128(COST_MAX_DIGITS, COST_PLACES)
_RATIO = pa.decimal128(12, 4)

# (column name, dataclass field, Arrow type): the exports' column spec (billing/exports.py), in the
# dataclasses' field order (tests/billing/test_unit_economics.py checks it), since rows are `astuple`s.
TENANT_COLUMNS = [
    ("period", "period", pa.date32()), ("tenant_id", "tenant_id", pa.int64()), ("tenant", "tenant", pa.string()),
    ("model", "model", pa.string()), ("adapter", "adapter", pa.string()), ("tier", "tier", pa.string()),
    ("kind", "kind", pa.string()), ("currency", "currency", pa.string()), ("requests", "requests", pa.int64()),
    ("input_tokens", "input_tokens", pa.int64()), ("cached_tokens", "cached_tokens", pa.int64()),
    ("output_tokens", "output_tokens", pa.int64()), ("revenue", "revenue", _AMOUNT), ("cost", "cost", _AMOUNT),
    ("margin", "margin", _AMOUNT), ("margin_percent", "margin_percent", pa.decimal128(12, 2)),
]
DEPLOYMENT_COLUMNS = [
    ("period", "period", pa.date32()), ("deployment", "deployment", pa.string()),
    ("worker_class", "worker_class", pa.string()), ("currency", "currency", pa.string()),
    ("replica_hours", "replica_hours", _RATIO), ("busy_hours", "busy_hours", _RATIO),
    ("utilisation", "utilisation", _RATIO), ("requests", "requests", pa.int64()),
    ("input_tokens", "input_tokens", pa.int64()), ("output_tokens", "output_tokens", pa.int64()),
    ("total_cost", "total_cost", _COST), ("attributed_cost", "attributed_cost", _COST),
    ("idle_cost", "idle_cost", _COST), ("cost_per_m_input", "cost_per_m_input", pa.decimal128(24, 6)),
    ("cost_per_m_output", "cost_per_m_output", pa.decimal128(24, 6)), ("unrated_hours", "unrated_hours", _RATIO),
]
VIEWS = {"tenants": TENANT_COLUMNS, "deployments": DEPLOYMENT_COLUMNS}


def report_rows(report: UnitEconomics, view: str) -> Iterator[tuple]:
    """The report's lines of one view ("tenants" or "deployments") as tuples in column order."""
    lines = report.tenants if view == "tenants" else report.deployments
    return (astuple(line) for line in lines)
