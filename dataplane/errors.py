"""The engine's errors that cross its layers: raised low (the scheduler, the grammar compiler), answered high
(the worker maps them to HTTP statuses), so they live below both."""


class QueueFullError(RuntimeError):
    """The waiting queue is at its configured limit: the caller should back off and retry."""
