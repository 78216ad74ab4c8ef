"""Limits that hold across gateway processes: reserve before the work, settle after, release on failure.

Two backends with one contract (`Limiter`): Redis (one Lua script per call) when REDIS_URL is set,
else the database (a row lock per tenant). base.py holds the shared types, factory.py the choice.
"""

from .base import (
    BudgetSeed,
    Decision,
    Limiter,
    LimitPlan,
    Settlement,
    TenantLimits,
    WindowState,
    period_start,
)
from .factory import get_limiter, reset_limiter

__all__ = [
    "BudgetSeed", "Decision", "Limiter", "LimitPlan", "Settlement", "TenantLimits", "WindowState",
    "get_limiter", "period_start", "reset_limiter",
]
