"""Finance exports: streamed CSV / Parquet over HTTP and the management command; totals reconcile
with the invoices to the cent."""

import csv
import io
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.http import StreamingHttpResponse

from billing import exports, services
from billing.models import Invoice
from billing.money import METERS, exact_sum, round_money

pytestmark = pytest.mark.django_db
D = Decimal
USAGE_URL = "/api/v1/billing/exports/usage"
INVOICES_URL = "/api/v1/billing/exports/invoices"
NOV = {"from": "2026-11-01", "to": "2026-12-01"}


@pytest.fixture(autouse=True)
def urls(settings):
    settings.ROOT_URLCONF = "tests.billing.urls"


@pytest.fixture
def finance_client(client, make_user):
    user = make_user("fiona", role="finance")
    client.force_login(user)
    return client


@pytest.fixture
def month(make_price, make_event, ingest, tenant, make_tenant, api_key):
    """Two tenants, a price change mid-month, odd token counts, a credit: a month worth reconciling."""
    make_price(inp="0.1500000001", cached="0.075", out="0.6")
    make_price(inp="0.17", cached="0.0850000003", out="0.66", start=datetime(2026, 11, 15, 6, tzinfo=UTC))
    make_price(model="qwen-1b", inp="0.02", cached="0.01", out="0.04")
    other = make_tenant()
    for i in range(120):
        ingest(make_event(
            tenant_id=(tenant if i % 3 else other).pk, api_key_id=None if i % 3 == 0 else api_key.pk,
            model="qwen-1b" if i % 5 == 0 else "llama-8b", adapter="sql-lora" if i % 7 == 0 else None,
            prompt_tokens=1000 + i * 7919 % 5000, cached_tokens=i * 31 % 900, completion_tokens=17 + i * 104_729 % 3000,
            created_at=datetime(2026, 11, 1, tzinfo=UTC) + timedelta(hours=i * 5, minutes=i),
        ))
    ingest(make_event(created_at=datetime(2026, 12, 2, tzinfo=UTC)))  # outside the month
    invoices = [services.invoice_draft_build(tenant=t, month=date(2026, 11, 1)) for t in (tenant, other)]
    services.invoice_line_add(invoice=invoices[0], kind="credit", description="goodwill", amount=D("-1.23"))
    return [services.invoice_finalize(invoice=i) for i in invoices]


def read_csv(response) -> list[dict]:
    assert isinstance(response, StreamingHttpResponse)
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def read_parquet(response):
    assert isinstance(response, StreamingHttpResponse)
    return pq.read_table(io.BytesIO(b"".join(response.streaming_content)))


def reconcile(usage_rows: list[dict], invoice_rows: list[dict]) -> None:
    """Σ exported request amounts per (invoice, price, model, adapter, meter), rounded half-up once,
    equals each usage line; lines add up to the invoice total; the whole reconciles to the cent."""
    per_line = defaultdict(list)
    for row in usage_rows:
        for meter in METERS:
            amount = D(str(row[f"{meter}_amount"]))
            per_line[(row["invoice_number"], str(row["price_id"]), row["model"], row["adapter"], meter)].append(amount)
    expected = {key: round_money(exact_sum(v), "ROUND_HALF_UP") for key, v in per_line.items()}
    expected = {key: amount for key, amount in expected.items() if amount or any(per_line[key])}
    billed, totals, line_sums = {}, {}, defaultdict(list)
    for row in invoice_rows:
        line_sums[row["invoice_number"]].append(D(str(row["amount"])))
        totals[row["invoice_number"]] = D(str(row["invoice_total"]))
        if row["kind"] == "usage":
            key = (row["invoice_number"], str(row["price_id"]), row["model"], row["adapter"], row["meter"])
            billed[key] = D(str(row["amount"]))
    assert billed == {k: v for k, v in expected.items() if k in billed or v}
    for number, total in totals.items():
        assert exact_sum(line_sums[number]) == total
    assert set(totals) == {r["invoice_number"] for r in usage_rows}


def test_usage_csv_streams_one_row_per_request(finance_client, month, tenant):
    response = finance_client.get(f"{USAGE_URL}.csv", NOV)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="usage-20261101-20261201.csv"' in response["Content-Disposition"]
    rows = read_csv(response)
    assert len(rows) == 120
    assert list(rows[0]) == [name for name, _, _ in exports.USAGE_COLUMNS]
    assert all("E" not in row["amount"] for row in rows)  # plain decimals, never scientific notation
    one = finance_client.get(f"{USAGE_URL}.csv", {**NOV, "tenant": tenant.slug})
    assert {r["tenant"] for r in read_csv(one)} == {tenant.slug}


def test_exports_match_invoices_to_the_cent_csv(finance_client, month):
    usage = read_csv(finance_client.get(f"{USAGE_URL}.csv", NOV))
    invoices = read_csv(finance_client.get(f"{INVOICES_URL}.csv", NOV))
    reconcile(usage, invoices)
    assert {r["invoice_number"] for r in invoices} == {i.number for i in month}
    assert exact_sum(D(r["amount"]) for r in invoices) == exact_sum(i.total for i in month)


def test_exports_match_invoices_to_the_cent_parquet(finance_client, month):
    usage = read_parquet(finance_client.get(f"{USAGE_URL}.parquet", NOV))
    invoices = read_parquet(finance_client.get(f"{INVOICES_URL}.parquet", NOV))
    assert str(usage.schema.field("amount").type) == "decimal128(32, 16)"
    assert str(invoices.schema.field("amount").type) == "decimal128(20, 2)"
    reconcile(usage.to_pylist(), invoices.to_pylist())


def test_export_command_csv_to_stdout_and_parquet_to_file(month, tmp_path, finance_client):
    out = io.StringIO()
    call_command("export_usage", "--month", "2026-11", "--format", "csv", stdout=out)
    from_command = list(csv.DictReader(io.StringIO(out.getvalue())))
    over_http = read_csv(finance_client.get(f"{USAGE_URL}.csv", NOV))
    assert from_command == over_http
    target = tmp_path / "usage.parquet"
    call_command("export_usage", "--month", "2026-11", "--format", "parquet", "--out", str(target))
    table = pq.read_table(target)
    assert table.num_rows == 120
    assert exact_sum(table.column("amount").to_pylist()) == exact_sum(D(r["amount"]) for r in from_command)
    csv_file = tmp_path / "usage.csv"
    call_command("export_usage", "--month", "2026-11", "--out", str(csv_file))
    assert csv_file.read_bytes().decode() == out.getvalue()


def test_streaming_emits_chunks_as_rows_arrive(month, monkeypatch):
    monkeypatch.setattr(exports, "CHUNK_ROWS", 50)
    start, end = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
    rows = exports.usage_rows(start=start, end=end)
    assert not isinstance(rows, list | tuple)  # a database iterator, not a loaded list
    chunks = list(exports.csv_stream(exports.USAGE_COLUMNS, rows))
    assert len(chunks) == 1 + 3  # header, then 120 rows in batches of 50
    parts = list(exports.parquet_stream(exports.USAGE_COLUMNS, exports.usage_rows(start=start, end=end), row_group=50))
    assert pq.ParquetFile(io.BytesIO(b"".join(parts))).metadata.num_row_groups == 3


def test_void_invoices_are_left_out_unless_asked(month):
    services.invoice_void(invoice=month[1])
    numbers = {row[1] for row in exports.invoice_rows(start=date(2026, 11, 1), end=date(2026, 12, 1))}
    assert numbers == {month[0].number}


@pytest.mark.parametrize(
    ("params", "field"),
    [({"to": "2026-12-01"}, "from"), ({"from": "yesterday", "to": "2026-12-01"}, "from"),
     ({"from": "2026-12-01", "to": "2026-11-01"}, "to"), ({**NOV, "tenant": "nobody"}, "tenant")],
)
def test_bad_parameters_are_400(finance_client, params, field):
    response = finance_client.get(f"{USAGE_URL}.csv", params)
    assert response.status_code == 400 and field in response.json()


def test_exports_need_the_finance_permission(client, tenant, db):
    assert client.get(f"{USAGE_URL}.csv", NOV).status_code == 401
    user = User.objects.create_user("ops", password="pw", is_staff=True)  # plain staff: no role, no exports
    client.force_login(user)
    assert client.get(f"{USAGE_URL}.csv", NOV).status_code == 403
    assert client.get(f"{INVOICES_URL}.parquet", NOV).status_code == 403


def test_tenant_api_keys_cannot_export(client, tenant):
    from tenants import services as tenant_services

    created = tenant_services.api_key_create(tenant=tenant, name="mgmt", can_manage=True)
    response = client.get(f"{USAGE_URL}.csv", NOV, HTTP_AUTHORIZATION=f"Bearer {created.secret}")
    assert response.status_code == 403


def test_invoice_rows_are_per_line_with_invoice_columns(month):
    rows = list(exports.invoice_rows(start=date(2026, 11, 1), end=date(2026, 12, 1)))
    names = [name for name, _, _ in exports.INVOICE_COLUMNS]
    kinds = {dict(zip(names, r, strict=True))["kind"] for r in rows}
    assert kinds == {"usage", "credit"}
    assert Invoice.objects.filter(status="finalized").count() == 2
