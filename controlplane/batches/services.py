"""Batches: create, validate, cancel, finalize; the lifecycle is OpenAI's.

validating → in_progress → finalizing → completed, or failed (the input does not validate),
expired (the 24 h window passed: what was answered is kept, the rest fail `batch_expired`),
cancelling → cancelled (new lines stop; answered ones are kept in the output file).
"""

from __future__ import annotations

import datetime as dt
import uuid

import orjson
from django.db import DataError, transaction
from django.utils import timezone

from common.errors import ApplicationError

from . import files, signals, storable
from .models import Batch, BatchLine, StoredFile

# A batch's endpoint -> the gateway's request kind its lines are sent as (proxy.handle): an embeddings
# line meets the embeddings path's parsing, limits and price line, at the batch share.
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}
WINDOWS = {"24h": dt.timedelta(hours=24)}
MAX_ERRORS = 100  # validation errors shown on a failed batch
TERMINAL = {Batch.Status.COMPLETED, Batch.Status.FAILED, Batch.Status.EXPIRED, Batch.Status.CANCELLED}


def batch_create(*, tenant_id: int, api_key_id: int, input_file_id: str, endpoint: str, completion_window: str,
                 metadata: dict | None) -> Batch:
    if endpoint not in ENDPOINTS:
        raise files.invalid(f"Invalid value for 'endpoint': supported are {', '.join(sorted(ENDPOINTS))}; "
                            f"got {endpoint!r}.", "endpoint", "invalid_value")
    if completion_window not in WINDOWS:
        raise files.invalid(f"Invalid value for 'completion_window': only '24h' is supported, got {completion_window!r}.",
                            "completion_window", "invalid_value")
    if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16 or any(
            not isinstance(k, str) or not isinstance(v, str) or len(k) > 64 or len(v) > 512 for k, v in metadata.items())):
        raise files.invalid("Invalid 'metadata': at most 16 string keys (64 characters) with string values "
                            "(512 characters).", "metadata", "invalid_value")
    source = files.file_get(tenant_id=tenant_id, file_id=input_file_id)
    if source.purpose != StoredFile.Purpose.BATCH:
        raise files.invalid(f"File {input_file_id} has purpose {source.purpose!r}; a batch needs a 'batch' file.",
                            "input_file_id", "invalid_value")
    now = timezone.now()
    with transaction.atomic():
        batch = Batch.objects.create(
            id=f"batch_{uuid.uuid4().hex[:24]}", tenant_id=tenant_id, api_key_id=api_key_id, endpoint=endpoint,
            input_file_id=input_file_id, completion_window=completion_window, metadata=metadata,
            expires_at=now + WINDOWS[completion_window])
        transaction.on_commit(lambda: signals.batch_run_wanted.send(sender=Batch, batch_id=batch.pk))
    return batch


def _line_errors(data: bytes, endpoint: str) -> tuple[list[BatchLine], list[dict]]:
    lines: list[BatchLine] = []
    errors: list[dict] = []
    seen: set[str] = set()

    def error(number: int, code: str, message: str, param: str | None = None) -> None:
        errors.append({"code": code, "message": message, "param": param, "line": number})

    for number, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        try:  # checked at upload; a file stored under older rules is checked again here
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            item = None
        if not isinstance(item, dict):
            error(number, "invalid_json", "The line is not a JSON object.")
            continue
        custom_id = item.get("custom_id")
        body = item.get("body")
        nul = storable.line_nul_at(raw, item)
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 512:
            error(number, "invalid_custom_id", "custom_id must be a string of 1 to 512 characters.", "custom_id")
        elif nul is not None:
            error(number, "invalid_custom_id" if nul == "custom_id" else "invalid_body",
                  f"The line holds a NUL character (\\u0000) in {nul}, which cannot be stored.", nul)
        elif custom_id in seen:
            error(number, "duplicate_custom_id", f"The custom_id {custom_id!r} is used by more than one line.",
                  "custom_id")
        elif item.get("method", "POST") != "POST":
            error(number, "invalid_method", "Only POST requests are supported in a batch.", "method")
        elif item.get("url") != endpoint:  # one endpoint per batch, as OpenAI's: no mixed files
            error(number, "mismatched_url", f"The line's url {item.get('url')!r} is not the batch's endpoint "
                  f"{endpoint!r}; every line of a batch must use its endpoint.", "url")
        elif not isinstance(body, dict) or not isinstance(body.get("model"), str):
            error(number, "invalid_body", "body must be an object naming a model.", "body")
        elif body.get("stream"):
            error(number, "invalid_body", "Streaming is not supported in a batch.", "body.stream")
        else:
            seen.add(custom_id)
            lines.append(BatchLine(line_no=number, custom_id=custom_id, body=body))
    return lines, errors


def batch_validate(*, batch_id: str) -> Batch:
    """validating → in_progress (lines copied into rows), failed (errors listed: the input does not
    validate, or its lines cannot be stored) or expired (its window passed first). Idempotent."""
    batch = Batch.objects.get(pk=batch_id)
    if batch.status != Batch.Status.VALIDATING:
        return batch
    if batch.expires_at <= timezone.now():
        batches_expire_validating(batch_id=batch_id)
        return Batch.objects.get(pk=batch_id)
    try:
        _, data = files.file_content(tenant_id=batch.tenant_id, file_id=batch.input_file_id)
        lines, errors = _line_errors(data, batch.endpoint)
    except ApplicationError as exc:  # the input file was deleted meanwhile
        lines, errors = [], [_error(exc.code, exc.message, "input_file_id")]
    except FileNotFoundError:  # its row is there, its bytes are not: no run will ever read them
        lines, errors = [], [_error("file_not_found", "The input file's content is missing.", "input_file_id")]
    if not lines and not errors:
        errors = [_error("empty_file", "The input file has no requests.")]
    now = timezone.now()
    with transaction.atomic():
        batch = Batch.objects.select_for_update().get(pk=batch_id)
        if batch.status != Batch.Status.VALIDATING:
            return batch
        if not errors:
            errors = _lines_store(batch, lines)
        if errors:
            batch.status, batch.failed_at = Batch.Status.FAILED, now
            batch.errors = {"object": "list", "data": errors}
        else:
            batch.status, batch.in_progress_at, batch.request_total = Batch.Status.IN_PROGRESS, now, len(lines)
        batch.save()
    return batch


def _error(code: str, message: str, param: str | None = None, line: int | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}


def _lines_store(batch: Batch, lines: list[BatchLine]) -> list[dict]:
    """The lines as rows; the errors when the database refuses them. The checks above are meant to
    leave nothing it refuses, but a refusal must fail the batch, not leave it `validating` to be
    retried for ever (a DataError is the same on every try)."""
    for line in lines:
        line.batch = batch
    try:
        with transaction.atomic():  # a savepoint: the batch's own row is still written after a refusal
            BatchLine.objects.bulk_create(lines, ignore_conflicts=True)
    except DataError as exc:
        # Its first line only (PostgreSQL's CONTEXT quotes the data), and never a NUL (the errors are jsonb too).
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0].replace("\x00", "")
        return [_error("invalid_file", f"The input file's lines could not be stored: {reason}.")]
    return []


def batches_expire_validating(*, batch_id: str | None = None) -> int:
    """Every batch (or the one) still `validating` once its window has passed is `expired`, as a batch
    in any other live state is by its runner: a batch that can never be validated ends within its window."""
    now = timezone.now()
    rows = Batch.objects.filter(status=Batch.Status.VALIDATING, expires_at__lte=now)
    return (rows.filter(pk=batch_id) if batch_id else rows).update(
        status=Batch.Status.EXPIRED, expired_at=now, lease_until=None,
        errors={"object": "list", "data": [_error(
            "batch_expired", "The batch's completion window passed before its input file was validated.")]})


def batch_cancel(*, tenant_id: int, batch_id: str) -> Batch:
    with transaction.atomic():
        batch = batch_get(tenant_id=tenant_id, batch_id=batch_id, lock=True)
        if batch.status in TERMINAL or batch.status == Batch.Status.CANCELLING:
            if batch.status in (Batch.Status.CANCELLED, Batch.Status.CANCELLING):
                return batch
            raise ApplicationError(f"Cannot cancel a batch that is {batch.status}.", code="invalid_state", status=409)
        batch.status, batch.cancelling_at = Batch.Status.CANCELLING, timezone.now()
        batch.save(update_fields=["status", "cancelling_at"])
        # The runner finishes it; a batch whose runner is gone (or never started) is finished by this one.
        transaction.on_commit(lambda: signals.batch_run_wanted.send(sender=Batch, batch_id=batch.pk))
    return batch


def batch_get(*, tenant_id: int, batch_id: str, lock: bool = False) -> Batch:
    rows = Batch.objects.select_for_update() if lock else Batch.objects
    found = rows.filter(tenant_id=tenant_id, pk=batch_id).first()
    if found is None:
        raise ApplicationError(f"No batch found with id '{batch_id}'.", code="batch_not_found", status=404,
                               param="batch_id")
    return found


def batch_list(*, tenant_id: int, limit: int, after: str | None) -> list[Batch]:
    rows = Batch.objects.filter(tenant_id=tenant_id).order_by("-created_at", "-id")
    if after:
        anchor = batch_get(tenant_id=tenant_id, batch_id=after)
        rows = rows.filter(created_at__lt=anchor.created_at)
    return list(rows[:limit])


def _epoch(value) -> int | None:
    return int(value.timestamp()) if value else None


def batch_card(batch: Batch) -> dict:
    return {
        "id": batch.id, "object": "batch", "endpoint": batch.endpoint, "errors": batch.errors,
        "input_file_id": batch.input_file_id, "completion_window": batch.completion_window, "status": batch.status,
        "output_file_id": batch.output_file_id or None, "error_file_id": batch.error_file_id or None,
        "created_at": _epoch(batch.created_at), "in_progress_at": _epoch(batch.in_progress_at),
        "expires_at": _epoch(batch.expires_at), "finalizing_at": _epoch(batch.finalizing_at),
        "completed_at": _epoch(batch.completed_at), "failed_at": _epoch(batch.failed_at),
        "expired_at": _epoch(batch.expired_at), "cancelling_at": _epoch(batch.cancelling_at),
        "cancelled_at": _epoch(batch.cancelled_at),
        "request_counts": {"total": batch.request_total, "completed": batch.request_completed,
                           "failed": batch.request_failed},
        "metadata": batch.metadata,
    }
