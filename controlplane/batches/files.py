"""Files: upload, read and delete a tenant's files (services and selectors in one small module).

A `batch` upload is checked when it arrives, not only when a batch uses it: valid UTF-8 JSON lines,
at most TESSERA_FILES_MAX_LINES of them and TESSERA_FILES_MAX_BYTES in all, and within the tenant's
total (TESSERA_FILES_TENANT_MAX_BYTES). Another tenant's file is a 404, never a 403.
"""

from __future__ import annotations

import uuid
from typing import IO

import orjson
from django.core.files.base import ContentFile, File
from django.db import transaction
from django.db.models import Sum

from common.errors import ApplicationError
from tenants.models import Tenant

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


def tenant_bytes(*, tenant_id: int, lock: bool = False) -> int:
    """The bytes of all the tenant's files: inputs, outputs and errors. With `lock`, the tenant's row
    is held until the transaction ends: every write that counts against the cap takes it first, so
    that two (an upload and a batch's output, or two uploads) cannot both pass the cap."""
    if lock:
        # NO KEY: rows that only reference the tenant (its usage, its keys) are inserted meanwhile.
        Tenant.objects.select_for_update(no_key=True).filter(pk=tenant_id).first()
    return StoredFile.objects.filter(tenant_id=tenant_id).aggregate(n=Sum("bytes"))["n"] or 0


def _store(*, tenant_id: int, filename: str, data: bytes, purpose: str, lines: int) -> StoredFile:
    file_id = new_file_id()
    with transaction.atomic():
        used = tenant_bytes(tenant_id=tenant_id, lock=True)
        if used + len(data) > conf.tenant_max_bytes():
            raise ApplicationError(
                f"Storing this file would take the tenant's files to {used + len(data)} bytes, over its cap "
                f"of {conf.tenant_max_bytes()}. Delete files you no longer need.",
                code="storage_quota_exceeded", status=413, param="file")
        return _save(tenant_id=tenant_id, file_id=file_id, filename=filename, content=ContentFile(data),
                     size=len(data), purpose=purpose, lines=lines)


def _save(*, tenant_id: int, file_id: str, filename: str, content: File, size: int, purpose: str,
          lines: int) -> StoredFile:
    storage = files_storage()
    name = storage.save(f"{tenant_id}/{file_id}", content)  # the storage reads `content` in chunks
    try:
        return StoredFile.objects.create(id=file_id, tenant_id=tenant_id, purpose=purpose, filename=filename[:255],
                                         bytes=size, lines=lines, storage_name=name)
    except Exception:
        storage.delete(name)
        raise


def output_file_store(*, tenant_id: int, file_id: str, filename: str, content: File, size: int,
                      lines: int) -> StoredFile:
    """A batch's output or error file, `size` bytes read from `content` (a file on disk, never the
    whole output in memory). The caller holds the tenant's row (tenant_bytes(lock=True)) and has
    already kept the output within the tenant's cap (output.py)."""
    storage = files_storage()
    if storage.exists(f"{tenant_id}/{file_id}"):  # bytes of a finalize killed before its rows were committed
        storage.delete(f"{tenant_id}/{file_id}")
    return _save(tenant_id=tenant_id, file_id=file_id, filename=filename, content=content, size=size,
                 purpose=StoredFile.Purpose.BATCH_OUTPUT, lines=lines)


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


def file_open(*, tenant_id: int, file_id: str) -> tuple[StoredFile, IO[bytes]]:
    """The file and its bytes opened for reading: a reader takes them in chunks (an output file may
    hold up to the tenant's whole cap)."""
    found = file_get(tenant_id=tenant_id, file_id=file_id)
    return found, files_storage().open(found.storage_name, "rb")


def file_content(*, tenant_id: int, file_id: str) -> tuple[StoredFile, bytes]:
    """The whole file in memory: for a file known to be small, such as an input file (its upload's cap
    bounds it). Readers of output files use file_open."""
    found, handle = file_open(tenant_id=tenant_id, file_id=file_id)
    with handle:
        return found, handle.read()


def file_delete(*, tenant_id: int, file_id: str) -> str:
    found = file_get(tenant_id=tenant_id, file_id=file_id)
    found.delete()  # the bytes follow once committed (storage.forget_bytes)
    return found.pk


def file_card(stored: StoredFile) -> dict:
    return {"id": stored.id, "object": "file", "bytes": stored.bytes, "created_at": int(stored.created_at.timestamp()),
            "filename": stored.filename, "purpose": stored.purpose, "status": "processed", "status_details": None,
            "expires_at": None}
