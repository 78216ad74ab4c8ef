"""Settings of files and batches, with their defaults (each can be set in the environment; see
docs/batches.md)."""

from __future__ import annotations

import os

from django.conf import settings


def _int(name: str, default: int) -> int:
    return int(getattr(settings, name, None) or os.environ.get(name, default))


def _float(name: str, default: float) -> float:
    return float(getattr(settings, name, None) or os.environ.get(name, default))


def file_max_bytes() -> int:
    """One upload's cap; the gateway's body cap (TESSERA_MAX_REQUEST_BYTES) applies first."""
    return _int("TESSERA_FILES_MAX_BYTES", 100 * 1024 * 1024)


def file_max_lines() -> int:
    return _int("TESSERA_FILES_MAX_LINES", 50_000)  # OpenAI's cap on requests per batch


def tenant_max_bytes() -> int:
    """All of a tenant's stored files together: inputs, and batches' output and error files."""
    return _int("TESSERA_FILES_TENANT_MAX_BYTES", 10 * 1024 * 1024 * 1024)


def batch_priority() -> int:
    """X-Priority of batch lines: above (after) every online tier's, so they run in what online leaves."""
    return _int("TESSERA_BATCH_PRIORITY", 1000)


def batch_concurrency() -> int:
    """Lines of one batch in flight at once."""
    return _int("TESSERA_BATCH_CONCURRENCY", 16)


def queue_ahead() -> int:
    """Batch lines a worker may hold waiting (beyond its seats) while nothing else waits there."""
    return _int("TESSERA_BATCH_QUEUE_AHEAD", 4)


def busy_share() -> int:
    """Batch lines a worker may hold while it runs online requests too."""
    return _int("TESSERA_BATCH_BUSY_SHARE", 1)


def lease_seconds() -> float:
    """A runner that has not renewed its batch for this long is taken as dead."""
    return _float("TESSERA_BATCH_LEASE_SECONDS", 60.0)


def max_attempts() -> int:
    """Tries of a line that meets a platform failure (a 5xx, or its runner dying under it) before it fails."""
    return _int("TESSERA_BATCH_LINE_ATTEMPTS", 5)


def db_wait_seconds() -> float:
    """How long a runner waits out a database that does not answer (storing an answer, renewing its
    lease) before it gives up; the batch is resumed once the database is back (tasks.py)."""
    return _float("TESSERA_BATCH_DB_WAIT_SECONDS", 60.0)


def max_line_output_bytes() -> int:
    """The largest answer one batch line may store (its body as the worker sent it); a larger one fails
    the line `output_too_large`. 16 MiB: an embeddings line of 2,048 inputs of a 576-wide model is about
    6 MB as base64 and 23 MB as JSON floats."""
    return _int("TESSERA_BATCH_MAX_LINE_OUTPUT_BYTES", 16 * 1024 * 1024)
