"""What a batch produces, within bounds: each line's answer under a cap, and the output and error
files written line by line, within the tenant's storage cap.

- One line's answer may be at most TESSERA_BATCH_MAX_LINE_OUTPUT_BYTES (`capped`, applied by the
  runner before the answer is parsed or stored): an embeddings line of 2,048 inputs is megabytes of
  floats, and 50,000 such lines would be gigabytes held in the database and in memory.
- The files are written a few rows at a time (ROWS_PER_FETCH) into temporary files on disk, which
  the files storage then reads in chunks: memory holds a few lines whatever the batch's size.
- The output counts against the tenant's storage cap (TESSERA_FILES_TENANT_MAX_BYTES) like an upload.
  The runner sends no line once the batch's stored answers reach it (quota.py, sized by
  `answer_bytes`); this is the exact check behind it, for the few lines in flight at the cap:
  answered lines are written while they fit; the first that would pass the cap, and every answered
  line after it, go to the error file as `storage_quota_exceeded` instead. The error file is always
  stored (it says what became of each line) and counts like any file.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile

import orjson
from django.core.files.base import File

from common.errors import ApplicationError

from . import conf, files
from .models import Batch, BatchLine

ROWS_PER_FETCH = 16  # rows held in memory at once while the files are written
# What a record needs: not the line's request body (as large as its answer can be).
RECORD_FIELDS = ("id", "batch_id", "line_no", "custom_id", "state", "status_code", "request_id", "response", "error")
QUOTA_EXCEEDED = "storage_quota_exceeded"


def capped(status: int, content: bytes) -> tuple[int, bytes]:
    """A line's answer as the runner records it: one over the cap becomes a 413 `output_too_large`
    error (a 4xx: the line fails and is not sent again; the worker did the work, so it is billed)."""
    limit = conf.max_line_output_bytes()
    if len(content) <= limit:
        return status, content
    error = ApplicationError(
        f"The answer to this line is {len(content)} bytes, over the cap of {limit} bytes on one batch line's "
        "answer. Split the request into smaller ones (fewer inputs per embeddings line, or "
        "encoding_format 'base64').", code="output_too_large", status=413)
    return error.status, orjson.dumps(error.openai_body())


def record(line: BatchLine) -> dict:
    """A line's record in the output or error file, in OpenAI's shape."""
    response = None
    if line.status_code is not None:
        response = {"status_code": line.status_code, "request_id": line.request_id, "body": line.response}
    return {"id": f"batch_req_{line.batch_id[6:]}_{line.line_no}", "custom_id": line.custom_id,
            "response": response, "error": line.error if line.state == BatchLine.State.FAILED else None}


def answer_bytes(line: BatchLine, *, status_code: int, body) -> int:
    """The bytes the line's record will take in the output file once `body` is stored as its answer,
    exactly as `write` will write it: what the runner counts against the tenant's storage cap."""
    answered = copy.copy(line)
    answered.state, answered.status_code, answered.response, answered.error = (
        BatchLine.State.SUCCEEDED, status_code, body, None)
    return len(orjson.dumps(record(answered))) + 1


def quota_error(cap: int) -> dict:
    return {"code": QUOTA_EXCEEDED,
            "message": f"The request was answered (and billed) but its answer could not be stored: it would take "
                       f"the tenant's files past their storage cap of {cap} bytes. Delete files you no longer need."}


class Spool:
    """One file being written: records appended to a temporary file on disk."""

    def __init__(self) -> None:
        self.handle = tempfile.TemporaryFile()
        self.bytes = 0
        self.lines = 0

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.bytes += len(data)
        self.lines += 1


@dataclasses.dataclass
class Written:
    output: Spool
    errors: Spool
    first_over: int | None  # line_no of the first answered line failed for the storage cap

    def close(self) -> None:
        self.output.handle.close()
        self.errors.handle.close()


def write(batch: Batch, *, room: int) -> Written:
    """The batch's records, in line order, into an output and an error spool; the output kept within
    `room` bytes (what the tenant's cap leaves)."""
    written = Written(Spool(), Spool(), None)
    over = quota_error(conf.tenant_max_bytes())
    rows = batch.lines.order_by("line_no").only(*RECORD_FIELDS).iterator(chunk_size=ROWS_PER_FETCH)
    for line in rows:
        data = orjson.dumps(record(line)) + b"\n"
        if line.state != BatchLine.State.SUCCEEDED:
            written.errors.write(data)
        elif written.first_over is None and written.output.bytes + len(data) <= room:
            written.output.write(data)
        else:
            written.first_over = line.line_no if written.first_over is None else written.first_over
            failed = {**record(line), "response": None, "error": over}
            written.errors.write(orjson.dumps(failed) + b"\n")
    return written


def store(batch: Batch, written: Written) -> None:
    """Hand the spools to the files storage and set the batch's file ids and counts (saved by the
    caller); the tenant's row is held (files.tenant_bytes(lock=True)). Idempotent: the files' ids
    derive from the batch's."""
    for spool, suffix, field, kind in ((written.output, "o", "output_file_id", "output"),
                                       (written.errors, "e", "error_file_id", "error")):
        if spool.lines:
            spool.handle.seek(0)
            name = f"{batch.id}_{kind}.jsonl"
            stored = files.output_file_store(
                tenant_id=batch.tenant_id, file_id=f"file-{batch.id[6:28]}{suffix}{suffix}", filename=name,
                content=File(spool.handle, name=name), size=spool.bytes, lines=spool.lines)
            setattr(batch, field, stored.id)
    if written.first_over is not None:  # the lines say what their records say
        batch.lines.filter(state=BatchLine.State.SUCCEEDED, line_no__gte=written.first_over).update(
            state=BatchLine.State.FAILED, status_code=None, response=None,
            error=quota_error(conf.tenant_max_bytes()))
    batch.request_completed, batch.request_failed = written.output.lines, written.errors.lines
