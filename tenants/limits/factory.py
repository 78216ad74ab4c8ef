"""Which limiter this process uses: one instance per (backend, Redis URL), built on first use.

Kept apart from base.py so the shared types never import the backends that implement them.
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from . import refusals
from .base import Limiter
from .database import DatabaseLimiter
from .redis import RedisLimiter


@lru_cache(maxsize=1)
def _limiter(kind: str, redis_url: str) -> Limiter:
    # Imported on first use: the database backend needs Django's apps loaded, the Redis one its client.
    if kind == "redis":
        return RedisLimiter(redis_url)
    if kind == "database":
        return DatabaseLimiter()
    raise ValueError(f"TESSERA_LIMITER must be 'redis' or 'database', not {kind!r}")


def get_limiter() -> Limiter:
    return _limiter(settings.TESSERA_LIMITER, settings.REDIS_URL)


def reset_limiter() -> None:
    """Forget the instance (tests switch backends; settings changed), and the refusals it gave."""
    _limiter.cache_clear()
    refusals.clear()
