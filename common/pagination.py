"""The management API's one pagination: DRF's limit/offset, with bounds the databases can hold.

DRF's LimitOffsetPagination passes any digits on to the query: `?limit=10^23` is an out-of-range
bigint on PostgreSQL (a DataError, answered 400 by api_errors) but "datatype mismatch" on SQLite, a
500. A page holds at most MAX_LIMIT items (DRF clamps a larger limit, as it does for any max_limit),
and an offset past the largest integer both databases hold is that integer (an empty page).
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 1000
MAX_OFFSET = 2**63 - 1


class Pages(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_offset(self, request) -> int:
        return min(super().get_offset(request), MAX_OFFSET)
