"""The unit-economics report, its API, exports and command: numbers, roles and malformed input."""

from __future__ import annotations

import csv
import io
from dataclasses import fields
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command

from tests.billing.cost_fixtures import rate, span

pytestmark = pytest.mark.django_db
H = datetime(2026, 11, 10, 12, tzinfo=UTC)
URL = "/api/v1/billing/unit-economics"
EXPORT = "/api/v1/billing/exports/unit-economics"


@pytest.fixture(autouse=True)
def urls(settings):
    settings.ROOT_URLCONF = "tests.billing.urls"


@pytest.fixture
def served(make_price, make_event, ingest, tenant):
    """One replica on an H100 ($3.60/h) up 2 hours over two days; three requests; one unrated L40S hour."""
    from billing.services import cost_hours_rebuild

    make_price()  # llama-8b: 0.15 / 0.075 / 0.60 per 1M
    rate(start=H - timedelta(days=30), hourly="3.60")
    day_end = datetime(2026, 11, 10, 23, tzinfo=UTC)
    span(started_at=day_end, last_seen_at=day_end + timedelta(hours=2))  # 23:00 on the 10th to 01:00 on the 11th
    span(started_at=day_end, last_seen_at=day_end + timedelta(hours=1), worker_url="http://l40s:8000",
         worker_class="L40S", deployment="small")
    records = [
        ingest(make_event(created_at=day_end + timedelta(minutes=5), prompt_tokens=200_000, cached_tokens=0,
                          completion_tokens=5_000, worker_url="http://w1:8000")),  # 100 s + 100 s of work
        ingest(make_event(created_at=day_end + timedelta(minutes=65), prompt_tokens=400_000, cached_tokens=0,
                          completion_tokens=0, worker_url="http://w1:8000", batch_id="batch_1")),  # 200 s
        ingest(make_event(created_at=day_end + timedelta(minutes=6), worker_url="http://l40s:8000")),
    ]
    cost_hours_rebuild(start=day_end, end=day_end + timedelta(hours=2))
    return records


@pytest.fixture
def finance(client, make_user):
    client.force_login(make_user("fiona", role="finance"))
    return client


def _report(by="month"):
    from billing.costs.report import unit_economics

    return unit_economics(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 12, 1, tzinfo=UTC), period=by)


def test_the_report_joins_revenue_and_cost_and_reports_idle_and_dollars_per_mtok(served):
    report = _report()
    batch, online = sorted((t for t in report.tenants if t.model == "llama-8b" and t.cost), key=lambda t: t.kind)
    assert batch.kind == "batch" and online.kind == "online"
    assert online.revenue == served[0].amount + served[2].amount
    assert online.cost == Decimal("0.20")  # 200 s of work at $0.001/s
    assert online.margin == online.revenue - online.cost
    assert online.margin_percent == (online.margin * 100 / online.revenue).quantize(Decimal("0.01"))
    assert batch.cost == Decimal("0.20") and batch.revenue == served[1].amount
    h100 = next(d for d in report.deployments if d.worker_class == "H100")
    assert h100.replica_hours == 2 and h100.total_cost == Decimal("7.20")
    assert h100.attributed_cost + h100.idle_cost == h100.total_cost == Decimal("7.20")
    assert h100.utilisation == Decimal("0.0556")  # 400 s of 7,200
    assert h100.cost_per_m_input == Decimal("0.500000")  # $0.30 of prefill work over 600,000 tokens
    assert h100.cost_per_m_output == Decimal("20.000000")  # $0.10 over 5,000 tokens
    l40s = next(d for d in report.deployments if d.worker_class == "L40S")
    assert l40s.unrated_hours == 1 and l40s.total_cost == 0
    assert report.unrated_hours == 1 and report.unattributed_requests == 0
    assert any("no rate" in note for note in report.notes)
    (usd,) = report.summary
    assert usd.total_cost == Decimal("7.20") and usd.attributed_cost + usd.idle_cost == usd.total_cost
    assert usd.margin == usd.revenue - usd.total_cost


def test_by_day_splits_at_midnight(served):
    report = _report("day")
    assert {d.period for d in report.deployments} == {date(2026, 11, 10), date(2026, 11, 11)}
    assert sum(d.total_cost for d in report.deployments) == Decimal("7.20")
    assert {t.period for t in report.tenants if t.kind == "batch"} == {date(2026, 11, 11)}


def test_api_answers_finance_with_exact_decimal_strings(finance, served):
    body = finance.get(URL, {"month": "2026-11"}).json()
    assert body["month"] == "2026-11" and body["period"] == "month"
    assert body["summary"][0]["total_cost"] == "7.200000"
    assert {line["kind"] for line in body["tenants"]} >= {"online", "batch"}
    assert body["unrated_hours"] == "1.0000"


@pytest.mark.parametrize("params", [{}, {"month": "2026-13"}, {"month": "2026-1"}, {"month": "2026-11\x00"},
                                    {"month": "2026-11\n"}, {"month": "11-2026"}, {"month": "0000-01"},
                                    {"month": "2026-11", "by": "week"}, {"month": "2026-11", "by": "\x00"}])
def test_malformed_queries_are_400(finance, params):
    for url in (URL, f"{EXPORT}-tenants.csv", f"{EXPORT}-deployments.parquet"):
        response = finance.get(url, params)
        assert response.status_code == 400, (url, params, response.content[:200])


def test_only_finance_and_operators_see_it(client, make_user, tenant):
    from tenants import services as tenant_services

    assert client.get(URL, {"month": "2026-11"}).status_code == 401
    client.force_login(make_user("staff", is_staff=True))  # the smallest role: staff with none
    assert client.get(URL, {"month": "2026-11"}).status_code == 403
    assert client.get(f"{EXPORT}-tenants.csv", {"month": "2026-11"}).status_code == 403
    client.logout()
    key = tenant_services.api_key_create(tenant=tenant, name="mgmt", can_manage=True)
    response = client.get(URL, {"month": "2026-11"}, HTTP_AUTHORIZATION=f"Bearer {key.secret}")
    assert response.status_code == 403
    client.force_login(make_user("olga", role="operator"))
    assert client.get(URL, {"month": "2026-11"}).status_code == 200


def test_csv_and_parquet_exports_carry_the_report(finance, served):
    from billing.costs.export import DEPLOYMENT_COLUMNS, TENANT_COLUMNS
    from billing.costs.report import DeploymentLine, TenantLine

    assert [c[1] for c in TENANT_COLUMNS] == [f.name for f in fields(TenantLine)]
    assert [c[1] for c in DEPLOYMENT_COLUMNS] == [f.name for f in fields(DeploymentLine)]
    response = finance.get(f"{EXPORT}-deployments.csv", {"month": "2026-11"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert sum(Decimal(r["total_cost"]) for r in rows) == Decimal("7.20")
    response = finance.get(f"{EXPORT}-tenants.parquet", {"month": "2026-11", "by": "day"})
    table = pq.read_table(io.BytesIO(b"".join(response.streaming_content)))
    assert table.column_names == [c[0] for c in TENANT_COLUMNS]
    assert sum(table.column("cost").to_pylist()) == sum(t.cost for t in _report("day").tenants)


def test_an_empty_month_is_an_empty_report(finance):
    body = finance.get(URL, {"month": "1999-01"}).json()
    assert body["tenants"] == body["deployments"] == body["summary"] == [] and body["unattributed_requests"] == 0


def test_the_command_prints_rebuilds_and_exports(served, tmp_path, capsys):
    from billing.models import RequestCost

    RequestCost.objects.all().delete()
    call_command("unit_economics", "--month", "2026-11", "--rebuild")
    out = capsys.readouterr()
    assert "revenue" in out.out and "H100" in out.out and "no rate" in out.out
    assert RequestCost.objects.count() == 3
    target = tmp_path / "d.parquet"
    call_command("unit_economics", "--month", "2026-11", "--format", "parquet", "--view", "deployments",
                 "--out", str(target))
    assert pq.read_table(target).num_rows == 2
    call_command("unit_economics", "--month", "2026-11", "--format", "csv", "--by", "day")
    assert capsys.readouterr().out.startswith("period,tenant_id,tenant,")
    for bad in ("2026-13", "2026/11", "2026-11\x00"):
        with pytest.raises(CommandError):
            call_command("unit_economics", "--month", bad)


def test_the_usage_export_carries_each_request_s_cost(finance, served):
    response = finance.get("/api/v1/billing/exports/usage.csv", {"from": "2026-11-01", "to": "2026-12-01"})
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 3 and {r["worker_class"] for r in rows} == {"H100", "L40S"}
    assert sum(Decimal(r["cost"]) for r in rows) == _report().summary[0].attributed_cost
    assert {r["deployment"] for r in rows if r["worker_url"] == "http://w1:8000"} == {"llama"}
