"""The values of /v1 requests that are looked up or stored: parsed one way, on every endpoint.

A 500 is the platform's failure (it burns the availability SLO); a value the client got wrong is a
4xx in OpenAI's error body. Three shapes cover what the Files, Batches and Responses endpoints send
to the database:

- a page size: ASCII digits only. `str.isdigit()` accepts "²" (which `int()` refuses: that was a
  500), and `int()` alone accepts "+5", " 5", "1_0" and "٣", none of which a client means as a size.
- an object id: the ids this platform issues (`file-…`, `batch_…`, `resp_…`) are ASCII letters,
  digits, '-' and '_', at most 64. Any other string names nothing, so it gets the endpoint's own 404
  without a query: PostgreSQL refuses a NUL in a text parameter (a 500), SQLite took it (a 404), and
  the answer must not depend on the database.
- free text that is stored or compared (a filter, batch metadata): no NUL, which PostgreSQL refuses
  in `text` and `jsonb`; a 400 naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from common.errors import ApplicationError

ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
DIGITS = re.compile(r"[0-9]{1,9}")  # at most 9 digits: any page size we accept, and int() stays cheap

T = TypeVar("T")


def invalid_value(message: str, param: str) -> ApplicationError:
    return ApplicationError(message, code="invalid_value", status=400, param=param)


def page_limit(raw: str | None, *, default: int, maximum: int, param: str = "limit") -> int:
    """`?limit=`: a whole number from 1 to `maximum` written in ASCII digits; `default` when absent."""
    if raw is None:
        return default
    if DIGITS.fullmatch(raw) is None or not 1 <= int(raw) <= maximum:
        raise invalid_value(f"Invalid value for '{param}': expected an integer from 1 to {maximum}.", param)
    return int(raw)


def object_id(raw: str, not_found: Callable[[str], ApplicationError]) -> str:
    """`raw` if it can be an id this platform issued; else `not_found(raw)` (the endpoint's 404)."""
    if ID.fullmatch(raw) is None:
        raise not_found(raw)
    return raw


def nul_free(value: T, param: str) -> T:
    """`value` (a string, or JSON made of them) if no string in it, keys included, holds a NUL."""
    if _holds_nul(value):
        raise invalid_value(f"Invalid value for '{param}': the NUL character (\\u0000) is not allowed.", param)
    return value


def _holds_nul(value: object) -> bool:
    pending = [value]  # a loop, not recursion: a body may nest as deep as the JSON parser allows
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return False
