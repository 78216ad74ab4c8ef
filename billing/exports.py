"""Finance exports: one row per request (usage) or per invoice line (invoices), as CSV or Parquet.

Both formats stream: rows come from `.iterator()` (a server-side cursor on PostgreSQL) and are
written out in batches, so memory stays flat however many rows a month holds. Money columns are
exact decimals (text in CSV, decimal128 in Parquet), never floats.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import datetime
from decimal import Decimal
from itertools import islice

import pyarrow as pa
import pyarrow.parquet as pq

from billing.models import InvoiceLine, UsageRecord
from billing.models.costs import COST_MAX_DIGITS, COST_PLACES
from billing.money import (
    AMOUNT_MAX_DIGITS,
    AMOUNT_PLACES,
    MONEY_MAX_DIGITS,
    MONEY_PLACES,
    PRICE_MAX_DIGITS,
    PRICE_PLACES,
)

CHUNK_ROWS = 2000  # rows fetched per database round trip
PARQUET_ROW_GROUP = 50_000  # rows per Parquet row group (and per flush to the client)
_TS = pa.timestamp("us", tz="UTC")
_PRICE = pa.decimal128(PRICE_MAX_DIGITS, PRICE_PLACES)
_AMOUNT = pa.decimal128(AMOUNT_MAX_DIGITS, AMOUNT_PLACES)
_MONEY = pa.decimal128(MONEY_MAX_DIGITS, MONEY_PLACES)

# (column name, ORM path, Arrow type)
USAGE_COLUMNS = [
    ("request_id", "request_id", pa.string()),
    ("created_at", "created_at", _TS),
    ("tenant_id", "tenant_id", pa.int64()),
    ("tenant", "tenant__slug", pa.string()),
    ("api_key_prefix", "api_key_prefix", pa.string()),
    ("model", "model", pa.string()),
    ("adapter", "adapter", pa.string()),
    ("tier", "tier", pa.string()),
    ("status", "status", pa.string()),
    ("prompt_tokens", "prompt_tokens", pa.int64()),
    ("cached_tokens", "cached_tokens", pa.int64()),
    ("completion_tokens", "completion_tokens", pa.int64()),
    ("price_id", "price_id", pa.int64()),
    ("currency", "currency", pa.string()),
    ("input_per_mtok", "price__input_per_mtok", _PRICE),
    ("cached_input_per_mtok", "price__cached_input_per_mtok", _PRICE),
    ("output_per_mtok", "price__output_per_mtok", _PRICE),
    ("input_amount", "input_amount", _AMOUNT),
    ("cached_input_amount", "cached_input_amount", _AMOUNT),
    ("output_amount", "output_amount", _AMOUNT),
    ("amount", "amount", _AMOUNT),
    ("invoice_number", "invoice__number", pa.string()),
    ("batch_id", "batch_id", pa.string()),  # the /v1/batches batch a request was a line of ("" online)
    # What serving it cost (billing/costs/, docs/economics.md): empty until its hour is rebuilt.
    ("worker_url", "worker_url", pa.string()),
    ("deployment", "cost__deployment", pa.string()),
    ("worker_class", "cost__worker_class", pa.string()),
    ("cost_currency", "cost__currency", pa.string()),
    ("cost", "cost__cost", pa.decimal128(COST_MAX_DIGITS, COST_PLACES)),
]

INVOICE_COLUMNS = [
    ("invoice_id", "invoice_id", pa.int64()),
    ("invoice_number", "invoice__number", pa.string()),
    ("tenant_id", "invoice__tenant_id", pa.int64()),
    ("tenant", "invoice__tenant__slug", pa.string()),
    ("period_start", "invoice__period_start", pa.date32()),
    ("period_end", "invoice__period_end", pa.date32()),
    ("status", "invoice__status", pa.string()),
    ("currency", "invoice__currency", pa.string()),
    ("rounding", "invoice__rounding", pa.string()),
    ("invoice_total", "invoice__total", _MONEY),
    ("line_id", "id", pa.int64()),
    ("kind", "kind", pa.string()),
    ("description", "description", pa.string()),
    ("price_id", "price_id", pa.int64()),
    ("model", "model", pa.string()),
    ("adapter", "adapter", pa.string()),
    ("meter", "meter", pa.string()),
    ("quantity", "quantity", pa.int64()),
    ("unit_price_per_mtok", "unit_price", _PRICE),
    ("exact_amount", "exact_amount", _AMOUNT),
    ("amount", "amount", _MONEY),
]


def usage_rows(*, start: datetime, end: datetime, tenant_id: int | None = None) -> Iterator[tuple]:
    """Requests that started in [start, end), oldest first."""
    records = UsageRecord.objects.filter(created_at__gte=start, created_at__lt=end)
    if tenant_id is not None:
        records = records.filter(tenant_id=tenant_id)
    paths = [path for _, path, _ in USAGE_COLUMNS]
    return records.order_by("created_at", "id").values_list(*paths).iterator(chunk_size=CHUNK_ROWS)


def invoice_rows(*, start, end, tenant_id: int | None = None, include_void: bool = False) -> Iterator[tuple]:
    """Lines of the invoices whose period starts in [start, end)."""
    lines = InvoiceLine.objects.filter(invoice__period_start__gte=start, invoice__period_start__lt=end)
    if tenant_id is not None:
        lines = lines.filter(invoice__tenant_id=tenant_id)
    if not include_void:
        lines = lines.exclude(invoice__status="void")
    paths = [path for _, path, _ in INVOICE_COLUMNS]
    return lines.order_by("invoice_id", "id").values_list(*paths).iterator(chunk_size=CHUNK_ROWS)


def _csv_cell(value) -> object:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")  # never scientific notation
    if isinstance(value, datetime):
        return value.isoformat()
    return value


class _Line:
    """A write-only "file" that hands back what csv.writer wrote (the Django streaming CSV idiom)."""

    def write(self, value: str) -> str:
        return value


def csv_stream(columns, rows: Iterable[tuple]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow([name for name, _, _ in columns])
    batch: list[str] = []
    for row in rows:
        batch.append(writer.writerow([_csv_cell(v) for v in row]))
        if len(batch) >= CHUNK_ROWS:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)


class _ByteSink:
    """A file-like sink for ParquetWriter whose bytes are drained after each row group."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._position = 0
        self.closed = False

    def write(self, data) -> int:
        data = bytes(data)
        self._chunks.append(data)
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def drain(self) -> bytes:
        data, self._chunks = b"".join(self._chunks), []
        return data


def parquet_schema(columns) -> pa.Schema:
    return pa.schema([pa.field(name, arrow_type) for name, _, arrow_type in columns])


def parquet_stream(columns, rows: Iterable[tuple], row_group: int = PARQUET_ROW_GROUP) -> Iterator[bytes]:
    """Parquet bytes, one row group at a time; the footer comes last.

    Rows become Arrow record batches CHUNK_ROWS at a time (Python objects never pile up: Arrow's
    columnar copy is ~10x smaller), and `row_group` rows of batches are written as one row group.
    """
    schema = parquet_schema(columns)
    sink = _ByteSink()
    writer = pq.ParquetWriter(sink, schema, compression="zstd")
    rows = iter(rows)
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    try:
        while chunk := list(islice(rows, min(CHUNK_ROWS, row_group))):
            arrays = [pa.array(column, type=f.type) for column, f in zip(zip(*chunk, strict=True), schema, strict=True)]
            pending.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
            pending_rows += len(chunk)
            if pending_rows >= row_group:
                writer.write_table(pa.Table.from_batches(pending, schema=schema), row_group_size=row_group)
                pending, pending_rows = [], 0
                yield sink.drain()
        if pending:
            writer.write_table(pa.Table.from_batches(pending, schema=schema), row_group_size=row_group)
    finally:
        writer.close()
    yield sink.drain()
