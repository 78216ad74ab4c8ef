"""Billing models: the price book, the usage ledger and its daily roll-ups, invoices, Stripe state, and the
cost of serving (worker-class rates, replica spans, each replica-hour's and request's cost)."""

from .costs import ReplicaHourCost, ReplicaSpan, RequestCost, WorkerClassRate
from .invoices import Invoice, InvoiceLine
from .prices import Price
from .stripe import StripeCustomer, StripeEvent
from .usage import UsageDaily, UsageRecord

__all__ = ["Invoice", "InvoiceLine", "Price", "ReplicaHourCost", "ReplicaSpan", "RequestCost", "StripeCustomer",
           "StripeEvent", "UsageDaily", "UsageRecord", "WorkerClassRate"]
