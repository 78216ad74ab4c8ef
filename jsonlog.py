"""JSON log lines: one object per record, carrying `request_id` and any `extra=` fields.

One formatter for both planes. It sits at the top level, below every package, because the
control plane (Django settings) and the data-plane worker both use it and neither may import
the other's logging: the worker must not depend on Django, and importing `dataplane` loads torch.
"""

from __future__ import annotations

import logging

import orjson

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    """`ts`, `level`, `logger`, `msg`, then every non-standard record field (`extra=`) and `exc`."""

    ignored: frozenset[str] = _STANDARD  # LogRecord's own attributes, never copied into the line

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in self.ignored and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(payload, default=str).decode()
