"""Append-only audit log: who changed what that matters for access or money, when and from where.

Services call `audit.record(...)` or wrap an update in `with audit.change(...)`; the actor and
origin come from a context variable set by the middleware, the commands and the Celery tasks.
"""

from __future__ import annotations


def record(*args, **kwargs):
    from .writer import record as _record

    return _record(*args, **kwargs)


def change(*args, **kwargs):
    from .writer import change as _change

    return _change(*args, **kwargs)
