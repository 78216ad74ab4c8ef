"""Limits that hold across gateway processes: reserve before the work, settle after, release on failure.

Two backends with one contract (`Limiter`): Redis (one Lua script per call) when REDIS_URL is set,
else the database (a row lock per tenant). See base.py for the shared types.
"""

from .base import Decision, Limiter, LimitPlan, Settlement, WindowState, get_limiter, period_start

__all__ = ["Decision", "Limiter", "LimitPlan", "Settlement", "WindowState", "get_limiter", "period_start"]
