"""Files: upload, read and delete a tenant's files (services and selectors in one small module).

A `batch` upload is checked when it arrives, not only when a batch uses it: valid UTF-8 JSON lines,
at most TESSERA_FILES_MAX_LINES of them and TESSERA_FILES_MAX_BYTES in all, and within the tenant's
total (TESSERA_FILES_TENANT_MAX_BYTES). Another tenant's file is a 404, never a 403.
"""

from __future__ import annotations

import uuid

import orjson
from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import Sum

from controlplane.errors import ApplicationError

from . import conf, storable
from .models import StoredFile
from .storage import files_storage

UPLOAD_PURPOSES = {"batch"}


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> ApplicationError:
    return ApplicationError(message, code=code, status=400, param=param)


def count_json_lines(data: bytes) -> int:
    """The number of non-blank lines; 400 naming the first line that is not a JSON object or that
    holds what a line's row cannot store (storable.py)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("The file is not valid UTF-8.", "file", "invalid_file") from None
    count = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise invalid(f"Line {number} of the file is not valid JSON.", "file", "invalid_file") from None
        if not isinstance(value, dict):
            raise invalid(f"Line {number} of the file is not a JSON object.", "file", "invalid_file")
        where = storable.line_nul_at(line, value)
        if where is not None:  # PostgreSQL cannot store it: refused here, not found stuck at validation
            raise invalid(f"Line {number} of the file holds a NUL character (\\u0000) in {where}, which cannot "
                          "be stored. Remove it from the line.", "file", "invalid_file")
        count += 1
    return count


def file_create(*, tenant_id: int, filename: str, data: bytes, purpose: str) -> StoredFile:
    if purpose not in UPLOAD_PURPOSES:
        raise invalid(f"Invalid value for 'purpose': only 'batch' files are supported, got {purpose!r}.",
                      "purpose", "invalid_value")
    if len(data) > conf.file_max_bytes():
        raise ApplicationError(f"The file is {len(data)} bytes; files may be at most {conf.file_max_bytes()} bytes.",
                               code="file_too_large", status=413, param="file")
    if not data.strip():
        raise invalid("The file is empty.", "file", "invalid_file")
    lines = count_json_lines(data)
    if lines > conf.file_max_lines():
        raise invalid(f"The file has {lines} requests; a batch file may have at most {conf.file_max_lines()}.",
                      "file", "too_many_lines")
    return _store(tenant_id=tenant_id, filename=filename, data=data, purpose=purpose, lines=lines)


def _store(*, tenant_id: int, filename: str, data: bytes, purpose: str, lines: int, file_id: str | None = None) -> StoredFile:
    file_id = file_id or new_file_id()
    with transaction.atomic():
        # The tenant's row serialises its uploads, so two concurrent uploads cannot both pass the cap.
        from tenants.models import Tenant

        Tenant.objects.select_for_update().filter(pk=tenant_id).first()
        used = StoredFile.objects.filter(tenant_id=tenant_id).aggregate(n=Sum("bytes"))["n"] or 0
        if purpose != StoredFile.Purpose.BATCH_OUTPUT and used + len(data) > conf.tenant_max_bytes():
            raise ApplicationError(
                f"Storing this file would take the tenant's files to {used + len(data)} bytes, over its cap "
                f"of {conf.tenant_max_bytes()}. Delete files you no longer need.",
                code="storage_quota_exceeded", status=413, param="file")
        name = files_storage().save(f"{tenant_id}/{file_id}", ContentFile(data))
        try:
            return StoredFile.objects.create(id=file_id, tenant_id=tenant_id, purpose=purpose, filename=filename[:255],
                                             bytes=len(data), lines=lines, storage_name=name)
        except Exception:
            files_storage().delete(name)
            raise


def output_file_create(*, tenant_id: int, file_id: str, filename: str, data: bytes, lines: int) -> StoredFile:
    """A batch's output or error file; idempotent on `file_id` (a finalize that runs twice stores once)."""
    existing = StoredFile.objects.filter(pk=file_id).first()
    if existing is not None:
        return existing
    return _store(tenant_id=tenant_id, filename=filename, data=data, purpose=StoredFile.Purpose.BATCH_OUTPUT,
                  lines=lines, file_id=file_id)


def file_get(*, tenant_id: int, file_id: str) -> StoredFile:
    found = StoredFile.objects.filter(tenant_id=tenant_id, pk=file_id).first()
    if found is None:
        raise ApplicationError(f"No such File object: {file_id}", code="file_not_found", status=404, param="file_id")
    return found


def file_list(*, tenant_id: int, purpose: str | None, limit: int, after: str | None, ascending: bool) -> list[StoredFile]:
    rows = StoredFile.objects.filter(tenant_id=tenant_id)
    if purpose:
        rows = rows.filter(purpose=purpose)
    order = ("created_at", "id") if ascending else ("-created_at", "-id")
    if after:
        anchor = file_get(tenant_id=tenant_id, file_id=after)
        rows = rows.filter(created_at__gt=anchor.created_at) if ascending else rows.filter(created_at__lt=anchor.created_at)
    return list(rows.order_by(*order)[:limit])


def file_content(*, tenant_id: int, file_id: str) -> tuple[StoredFile, bytes]:
    found = file_get(tenant_id=tenant_id, file_id=file_id)
    with files_storage().open(found.storage_name, "rb") as handle:
        return found, handle.read()


def file_delete(*, tenant_id: int, file_id: str) -> str:
    found = file_get(tenant_id=tenant_id, file_id=file_id)
    found.delete()  # the bytes follow once committed (storage.forget_bytes)
    return found.pk


def file_card(stored: StoredFile) -> dict:
    return {"id": stored.id, "object": "file", "bytes": stored.bytes, "created_at": int(stored.created_at.timestamp()),
            "filename": stored.filename, "purpose": stored.purpose, "status": "processed", "status_details": None,
            "expires_at": None}
