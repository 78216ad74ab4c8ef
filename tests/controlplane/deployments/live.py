"""The live stack the deployment tests run against: benchmarks/live_stack.py (shared with
`benchmarks.autoscale`)."""

from benchmarks.live_stack import (  # noqa: F401 - re-exported for the tests
    MODEL,
    ROOT,
    TOKEN,
    Process,
    Stack,
    database_url,
    free_port,
    operator_client,
    wait_for,
)
