"""Which limiter this process uses: one instance per (backend, Redis URL), built on first use.

Kept apart from base.py so the shared types never import the backends that implement them.
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from .base import Limiter


@lru_cache(maxsize=1)
def _limiter(kind: str, redis_url: str) -> Limiter:
    # Imported on first use: the database backend needs Django's apps loaded, the Redis one its client.
    if kind == "redis":
        from .redis import RedisLimiter

        return RedisLimiter(redis_url)
    if kind == "database":
        from .database import DatabaseLimiter

        return DatabaseLimiter()
    raise ValueError(f"TESSERA_LIMITER must be 'redis' or 'database', not {kind!r}")


def get_limiter() -> Limiter:
    return _limiter(settings.TESSERA_LIMITER, settings.REDIS_URL)


def reset_limiter() -> None:
    """Forget the instance (tests switch backends; settings changed), and the refusals it gave."""
    from . import refusals

    _limiter.cache_clear()
    refusals.clear()
