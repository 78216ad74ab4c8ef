"""Which dependency an exception says is unreachable: the database, Redis, or neither (a bug).

A leaf module (Django's and redis-py's exception types only), so the usage writer, the spool and the
outage answers can all ask it without importing each other.
"""

from __future__ import annotations

import redis.exceptions
from django.db import InterfaceError, OperationalError

_KINDS: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((OperationalError, InterfaceError), "database"),
    ((redis.exceptions.ConnectionError, redis.exceptions.TimeoutError), "redis"),
)


def dependency_of(exc: BaseException) -> str | None:
    """'database' or 'redis' when `exc` (or what caused it) is that dependency being unreachable."""
    seen = 0
    while exc is not None and seen < 8:
        for types, name in _KINDS:
            if isinstance(exc, types):
                return name
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
