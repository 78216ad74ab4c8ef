"""The usage pipeline: every admitted request metered exactly once, whatever fails.

The meter (`accounting`), the journal of requests in flight (`journal`), the writer that group-commits
admissions and ledger rows (`usage_writer`, `usage_queue`), the spool that keeps them while the database
is away (`spool`), the sweeper that settles what a dead gateway left (`sweeper`), the worker's own counts
(`worker_usage`), reservation renewal (`renewal`) and their metrics.
"""
