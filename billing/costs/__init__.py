"""The cost of serving: pure arithmetic (allocation, attribution) and the unit-economics report.

Writes (rates, spans, the hourly rebuild) are services in billing/services/; this package holds what
they and the report share: how a replica-hour's cost is split, and how a worker's class is named.
"""
