"""Finance's export of the audit log: CSV or JSON Lines, streamed oldest first with flat memory."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator

from django.core.serializers.json import DjangoJSONEncoder

COLUMNS = ("id", "at", "actor_type", "actor", "actor_user_id", "actor_username", "actor_key_id", "actor_key_prefix",
           "action", "object_type", "object_id", "object_repr", "tenant_id", "changes", "channel", "via",
           "client_address", "request_id")
CHUNK_ROWS = 2000
FORMATS = ("csv", "jsonl")
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def rows(events) -> Iterator[dict]:
    """Oldest first (an export reads like a journal); a server-side cursor on PostgreSQL."""
    for values in events.order_by("at", "id").values_list(*COLUMNS).iterator(chunk_size=CHUNK_ROWS):
        yield dict(zip(COLUMNS, values, strict=True))


class _Line:
    def write(self, value: str) -> str:
        return value


def _cell(value) -> object:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, cls=DjangoJSONEncoder)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value  # a key name like "=HYPERLINK(...)" must stay text in a spreadsheet
    return value


def csv_stream(records: Iterable[dict]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(COLUMNS)
    batch: list[str] = []
    for record in records:
        batch.append(writer.writerow([_cell(record[c]) for c in COLUMNS]))
        if len(batch) >= CHUNK_ROWS:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)


def jsonl_stream(records: Iterable[dict]) -> Iterator[str]:
    batch: list[str] = []
    for record in records:
        batch.append(json.dumps(record, cls=DjangoJSONEncoder, sort_keys=True) + "\n")
        if len(batch) >= CHUNK_ROWS:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)


def stream(file_format: str, events) -> Iterator[str]:
    if file_format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {file_format!r}")
    return (csv_stream if file_format == "csv" else jsonl_stream)(rows(events))
