"""Capacity planning: how many replicas hold a tier's TTFT and ITL targets at a given load, and what
the tokens cost at that size, from the load curve each worker class measured (docs/economics.md)."""
