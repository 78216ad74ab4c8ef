"""Billing writes. Keyword-only `<entity>_<action>` functions; each one is a transaction."""

from .costs import cost_hour_rebuild, cost_hours_rebuild
from .invoices import (
    invoice_draft_build,
    invoice_finalize,
    invoice_line_add,
    invoice_mark_paid,
    invoice_void,
    invoices_build_month,
)
from .prices import price_create
from .replica_spans import replica_spans_observe
from .roles import FINANCE_GROUP, finance_group_ensure
from .rollups import usage_daily_rebuild
from .usage import usage_record_ingest, usage_records_reprice
from .webhooks import stripe_event_process
from .worker_rates import worker_rate_create

__all__ = [
    "cost_hour_rebuild",
    "cost_hours_rebuild",
    "FINANCE_GROUP",
    "finance_group_ensure",
    "invoice_draft_build",
    "invoice_finalize",
    "invoice_line_add",
    "invoice_mark_paid",
    "invoice_void",
    "invoices_build_month",
    "price_create",
    "replica_spans_observe",
    "stripe_event_process",
    "usage_daily_rebuild",
    "usage_record_ingest",
    "usage_records_reprice",
    "worker_rate_create",
]
