"""`manage.py unit_economics --month 2026-11 [--by month|day] [--rebuild] [--format table|csv|parquet
--view tenants|deployments --out FILE]`: the unit-economics report of one month."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from billing.costs.export import VIEWS, report_rows
from billing.costs.months import month_range
from billing.costs.report import PERIODS, unit_economics
from billing.management.export_out import write_export
from billing.services import cost_hours_rebuild


def _cell(value) -> str:
    return "" if value is None else str(value)


class Command(BaseCommand):
    help = "Revenue, attributed cost and margin per tenant x model x tier; $/M tokens, utilisation and idle per " \
           "deployment x worker class, for one month."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--month", required=True, help="YYYY-MM (UTC calendar month)")
        parser.add_argument("--by", choices=PERIODS, default="month", help="lines per month (default) or day")
        parser.add_argument("--rebuild", action="store_true",
                            help="recompute the month's replica-hour and request costs first (idempotent)")
        parser.add_argument("--format", choices=["table", "csv", "parquet"], default="table")
        parser.add_argument("--view", choices=sorted(VIEWS), default="tenants", help="csv / parquet: which lines")
        parser.add_argument("--out", help="file to write (csv / parquet; default: standard output for csv)")

    def handle(self, *args, month: str, by: str, rebuild: bool, format: str, view: str, out: str | None,
               **options) -> None:
        try:
            start, end = month_range(month)
        except ValueError as exc:
            raise CommandError(f"--month {exc}") from None
        if rebuild:
            rebuilt = cost_hours_rebuild(start=start, end=end)
            self.stderr.write(f"rebuilt {len(rebuilt)} hours: {sum(h.replica_hours for h in rebuilt)} "
                              f"replica-hours, {sum(h.requests for h in rebuilt)} requests costed")
        report = unit_economics(start=start, end=end, period=by)
        if format == "table":
            self._table(report)
            return
        write_export(self, VIEWS[view], report_rows(report, view), file_format=format, out=out)

    def _table(self, report) -> None:
        w = self.stdout.write
        w(f"Unit economics {report.start:%Y-%m} (per {report.period})")
        for s in report.summary:
            w(f"  {s.currency}: revenue {s.revenue:.2f}, cost {s.total_cost:.2f} (attributed "
              f"{s.attributed_cost:.2f}, idle {s.idle_cost:.2f}), margin {s.margin:.2f}")
        for note in report.notes:
            w(f"  note: {note}")
        w("\nperiod      tenant                model / adapter                tier       kind        "
          "requests     revenue        cost      margin  margin %")
        for t in report.tenants:
            name = f"{t.model}/{t.adapter}" if t.adapter else t.model
            w(f"{t.period}  {t.tenant[:20]:20}  {name[:30]:30}  {t.tier[:9]:9}  {t.kind:10}  {t.requests:8}  "
              f"{t.revenue:10.2f}  {t.cost:10.2f}  {t.margin:10.2f}  {_cell(t.margin_percent):>8} {t.currency}")
        w("\nperiod      deployment            worker class      replica h  util      idle    attributed"
          "   $/M in     $/M out")
        for d in report.deployments:
            w(f"{d.period}  {d.deployment[:20]:20}  {d.worker_class[:16]:16}  {d.replica_hours:9.2f}  "
              f"{_cell(d.utilisation):6}  {d.idle_cost:8.2f}  {d.attributed_cost:10.2f}  "
              f"{_cell(d.cost_per_m_input):>9}  {_cell(d.cost_per_m_output):>9} {d.currency}"
              + ("  (no rate: costed at zero)" if d.unrated_hours else ""))
