"""The one application error type billing raises; views map it to DRF's error format."""


class BillingError(Exception):
    """A billing operation that cannot proceed as asked (bad input, wrong invoice state...)."""


class InvoiceStateError(BillingError):
    """The invoice is not in a state that allows this operation (e.g. editing a finalized invoice)."""
