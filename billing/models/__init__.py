"""Billing models: the price book, the usage ledger and its daily roll-ups, invoices, Stripe state."""

from .invoices import Invoice, InvoiceLine
from .prices import Price
from .stripe import StripeCustomer, StripeEvent
from .usage import UsageDaily, UsageRecord

__all__ = ["Invoice", "InvoiceLine", "Price", "StripeCustomer", "StripeEvent", "UsageDaily", "UsageRecord"]
