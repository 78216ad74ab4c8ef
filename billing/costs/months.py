"""`YYYY-MM` as the API and the command take it: strictly parsed, as UTC bounds."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time

_MONTH = re.compile(r"(\d{4})-(\d{2})")


def month_range(raw: str | None) -> tuple[datetime, datetime]:
    """[first instant of the month, first instant of the next), UTC; ValueError saying why otherwise."""
    if not raw:
        raise ValueError("required: YYYY-MM")
    match = _MONTH.fullmatch(raw)  # fullmatch: no trailing newline, NUL or anything else after it
    if not match:
        raise ValueError(f"must be YYYY-MM, got {raw[:20]!r}")
    year, month = int(match[1]), int(match[2])
    if not (1 <= month <= 12 and 1970 <= year <= 9998):
        raise ValueError(f"no such month: {raw!r}")
    start = date(year, month, 1)
    end = date(year + (month == 12), month % 12 + 1, 1)
    return datetime.combine(start, time.min, tzinfo=UTC), datetime.combine(end, time.min, tzinfo=UTC)
