"""One batch line: sent through the gateway's request path, its outcome stored once.

Each attempt goes through `proxy.handle` under its own request id, carrying the line's ledger
identity (`lines.line_ledger_key`), on which the ledger is unique: whatever fails between the usage
write and the answer's, a second attempt of a served line cannot add a second row. The answer is
stored after the usage is durable (`accounting.accounted`), so a runner killed in between leaves the
line `running` for the next runner (lines.py), never answered and unbilled.

What an attempt's answer leads to:
- not run (a 429 that is a rate limit or shedding; no worker ready or reachable; usage not
  recordable; a dependency down): pending again after Retry-After, spending no try: an outage
  delays a batch, bounded by its completion window, rather than failing it;
- any other 5xx: again with backoff, up to TESSERA_BATCH_LINE_ATTEMPTS tries, then failed with it;
- anything else: answered (200) or failed with its error (a hard budget's `insufficient_quota`
  included).
Storing it: a database that does not answer is waited for, up to TESSERA_BATCH_DB_WAIT_SECONDS (the
line is never sent again for it); then `StoreGaveUp`, and the line, still `running`, is the next
runner's. An answer the database refuses fails the line with `answer_unstorable` instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import orjson
from django.db import OperationalError
from django.http import HttpRequest

from common.asyncdb import db_call
from common.errors import ApplicationError
from controlplane.gateway import proxy
from controlplane.gateway.dependencies import dependency_of
from controlplane.gateway.usage import accounting

from . import conf, lines, output
from .models import Batch, BatchLine
from .services import ENDPOINTS

log = logging.getLogger("tessera.batches")
T = TypeVar("T")

RETRYABLE_429 = {"rate_limit_exceeded", "overloaded", "priority_shed"}
# The line never ran (no worker could take it, its usage could not be recorded, a dependency the
# gateway needs did not answer): waiting costs it no try.
NOT_RUN = {"model_unavailable", "upstream_unavailable", "usage_unavailable", "service_unavailable"}
UNSTORABLE = ApplicationError("The answer to this request could not be stored.", code="answer_unstorable",
                              status=500, type="server_error")
BAD_ANSWER = {"error": {"message": "The worker's answer was not JSON.", "type": "server_error",
                        "param": None, "code": "bad_answer"}}


class StoreGaveUp(OperationalError):
    """The database did not answer within TESSERA_BATCH_DB_WAIT_SECONDS (an OperationalError: the Celery
    task retries the batch as for any database error)."""


async def db_waiting(fn: Callable[..., T], **kwargs) -> T:
    """`fn` on the database, waiting out an outage (PostgreSQL stopped, failing over) with backoff for
    up to TESSERA_BATCH_DB_WAIT_SECONDS; any other error is raised at once."""
    deadline = time.monotonic() + conf.db_wait_seconds()
    delay = 0.1
    while True:
        try:
            return await db_call(fn, **kwargs)
        except Exception as exc:
            if dependency_of(exc) != "database":
                raise
            if time.monotonic() + delay > deadline:
                raise StoreGaveUp(f"the database did not answer for {conf.db_wait_seconds():.0f} s") from exc
            log.warning("database unavailable; the batch runner waits", extra={"call": getattr(fn, "__name__", ""),
                                                                                 "error": repr(exc)[:200]})
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def send(batch: Batch, principal, line: BatchLine) -> int:
    """Send the line and store its outcome; the bytes its answer adds to the batch's output file (0 when
    the line failed or goes back to pending), which the runner counts against the tenant's storage cap."""
    key = lines.line_ledger_key(batch_id=batch.pk, custom_id=line.custom_id)
    try:
        response = await proxy.handle(HttpRequest(), ENDPOINTS[batch.endpoint], body=orjson.dumps(line.body),
                                      principal=principal, request_id=line.request_id, batch_id=batch.pk,
                                      batch_line=key)
    except Exception:  # proxy.handle answers its own errors: a bug there is a platform failure (tried again)
        log.exception("the gateway raised on a batch line", extra={"batch": batch.pk, "custom_id": line.custom_id})
        status, body, error, code, headers = 500, None, None, "internal_error", {}
    else:
        headers = response.headers
        status, content = output.capped(response.status_code, response.content)  # parsed and stored only under the cap
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            body = BAD_ANSWER
        error = body.get("error") if isinstance(body, dict) and status != 200 else None
        code = error.get("code") if isinstance(error, dict) else None
    if (status == 429 and code in RETRYABLE_429) or code in NOT_RUN:
        wait = float(headers.get("Retry-After", "1") or 1)
        await db_waiting(lines.line_retry, line_id=line.pk, request_id=line.request_id, after_seconds=wait,
                         count_attempt=False)
        return 0
    if status >= 500 and line.attempts < conf.max_attempts():
        await db_waiting(lines.line_retry, line_id=line.pk, request_id=line.request_id,
                         after_seconds=min(2.0 ** line.attempts, 30.0), count_attempt=True)
        return 0
    if body is None:
        body = ApplicationError("The gateway had an internal error.", code=code, status=status).openai_body()
        error = body["error"]
    await accounting.accounted(line.request_id)  # billed durably before the line says answered
    message = error.get("message") if isinstance(error, dict) else None
    line_error = None if status == 200 else {"code": code or "request_failed",
                                             "message": message if isinstance(message, str) else f"HTTP {status}"}
    return await _store_answer(line, ok=status == 200, status_code=status, body=body, error=line_error)


def _answer(*, line: BatchLine, ok: bool, status_code: int, body, error: dict | None) -> int:
    """Store the outcome; the bytes the answer adds to the output. Sized as finalize will write its
    record (0 for a failure: the error file is not capped), here on the database's thread, not the
    runner's event loop: serialising a 23 MB embeddings answer took 85-110 ms on a 2-core host."""
    size = output.answer_bytes(line, status_code=status_code, body=body) if ok else 0
    stored = lines.line_answer(line_id=line.pk, request_id=line.request_id, ok=ok, status_code=status_code,
                               body=body, error=error, output_bytes=size)
    return size if stored else 0


async def _store_answer(line: BatchLine, *, ok: bool, status_code: int, body, error: dict | None) -> int:
    try:
        return await db_waiting(_answer, line=line, ok=ok, status_code=status_code, body=body, error=error)
    except StoreGaveUp:
        raise
    except Exception:
        # Refused for what it holds (not an outage): sending it again would bill the work again for an
        # answer that cannot be kept either, so the line ends here, with an error line.
        log.exception("a batch line's answer could not be stored; failing the line",
                      extra={"batch": line.batch_id, "custom_id": line.custom_id, "request_id": line.request_id})
        await db_waiting(lines.line_answer, line_id=line.pk, request_id=line.request_id, ok=False,
                         status_code=UNSTORABLE.status, body=UNSTORABLE.openai_body(),
                         error={"code": UNSTORABLE.code, "message": UNSTORABLE.message})
        return 0
