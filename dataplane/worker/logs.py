"""JSON log lines on stderr: one object per record, with any `extra=` fields (request_id, tenant, ...).

Request logs carry ids, counts and timings; prompt and completion text are never logged.
"""

from __future__ import annotations

import logging
import sys

from jsonlog import JSONFormatter as _JSONFormatter


class JSONFormatter(_JSONFormatter):
    # uvicorn's records carry an ANSI-coloured copy of the message as `color_message`
    ignored = _JSONFormatter.ignored | {"color_message"}


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
