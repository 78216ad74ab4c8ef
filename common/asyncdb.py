"""Calling the (sync) Django ORM from async code off the request cycle.

`sync_to_async(thread_sensitive=True)` would funnel every call of the process through one thread;
the gateway's database work is independent per call, so it runs on the default executor instead,
with connections opened and recycled as in a request (CONN_MAX_AGE applies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

T = TypeVar("T")


def _in_request_like_scope(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


async def db_call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await sync_to_async(_in_request_like_scope, thread_sensitive=False)(fn, *args, **kwargs)
