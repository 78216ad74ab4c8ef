"""A batch's output within bounds: finalize writes the output file line by line (memory holds a few
lines, not the output), `GET /v1/files/{id}/content` streams it, the output counts against the
tenant's storage cap (answered lines past it fail `storage_quota_exceeded`), and one line's answer
may be at most TESSERA_BATCH_MAX_LINE_OUTPUT_BYTES (a larger one fails `output_too_large`)."""

from __future__ import annotations

import datetime as dt
import gc
import io
import json
import random
import tracemalloc
import uuid

import openai
import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from . import sink

pytestmark = pytest.mark.django_db(transaction=True)

LINES = 300
FLOATS = 4000  # an embedding per line: about 80 kB of JSON floats, 24 MB for the batch


def _line(custom_id: str, max_tokens: int = 4) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}}


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.fixture
def client_for(live_gateway, tenant_key, settings, tmp_path):
    settings.TESSERA_FILES_DIR = str(tmp_path / "files")

    def make():
        tenant, secret = tenant_key.sync(requests_per_minute=10_000)
        return tenant, openai.OpenAI(base_url=f"{live_gateway}/v1", api_key=secret, max_retries=0, timeout=60)

    return make


def _run(batch_id: str) -> str:
    from controlplane.batches.runner import run

    return async_to_sync(run)(batch_id)


def _answered_batch(tenant) -> str:
    """A batch whose LINES lines were answered, each with an embedding of FLOATS floats."""
    from controlplane.batches.models import Batch, BatchLine

    batch = Batch.objects.create(id=f"batch_{uuid.uuid4().hex[:24]}", tenant=tenant, endpoint="/v1/embeddings",
                                 input_file_id="file-x", status=Batch.Status.FINALIZING, request_total=LINES,
                                 expires_at=timezone.now() + dt.timedelta(hours=24))
    rng = random.Random(7)
    for start in range(0, LINES, 50):
        BatchLine.objects.bulk_create([BatchLine(
            batch=batch, line_no=n + 1, custom_id=f"e-{n}", body={"model": "m", "input": "x"}, state="succeeded",
            request_id=f"req_b{n}", status_code=200,
            response={"object": "list", "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1},
                      "data": [{"object": "embedding", "index": 0,
                                "embedding": [rng.uniform(-1, 1) for _ in range(FLOATS)]}]})
            for n in range(start, start + 50)])
    return batch.id


def _peak(work) -> tuple[object, int]:
    gc.collect()
    tracemalloc.start()
    try:
        result = work()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_finalize_writes_the_output_line_by_line_in_bounded_memory(client_for):
    from controlplane.batches.finalize import batch_finalize
    from controlplane.batches.models import StoredFile
    from controlplane.batches.storage import files_storage

    tenant, client = client_for()
    batch_id = _answered_batch(tenant)
    done, peak = _peak(lambda: batch_finalize(batch_id=batch_id))
    assert done.status == "completed" and (done.request_completed, done.request_failed) == (LINES, 0)
    stored = StoredFile.objects.get(pk=done.output_file_id)
    with files_storage().open(stored.storage_name, "rb") as handle:
        size = sum(len(chunk) for chunk in iter(lambda: handle.read(1 << 20), b""))
    assert stored.bytes == size > 20_000_000 and stored.lines == LINES
    # The whole output joined in memory (and every line's answer loaded) peaked above the output's size.
    assert peak < size / 4, f"finalize peaked at {peak} bytes for a {size}-byte output"



def test_file_content_is_streamed_in_bounded_memory(client_for):
    from django.core.files.base import ContentFile

    from controlplane.batches.models import StoredFile
    from controlplane.batches.storage import files_storage

    tenant, client = client_for()
    record = b'{"custom_id": "x", "response": {"body": "' + b"y" * 100_000 + b'"}}\n'
    file_id = f"file-{uuid.uuid4().hex[:24]}"
    name = files_storage().save(f"{tenant.pk}/{file_id}", ContentFile(record * 240))  # 24 MB, as an output file
    StoredFile.objects.create(id=file_id, tenant=tenant, purpose="batch_output", filename="out.jsonl",
                              bytes=len(record) * 240, lines=240, storage_name=name)
    size = len(record) * 240
    del record

    def download() -> int:
        with client.files.with_streaming_response.content(file_id) as answer:
            assert answer.headers["content-type"] == "application/jsonl"
            return sum(len(chunk) for chunk in answer.iter_bytes())

    assert download() == size  # once unmeasured: the process's first request imports the URL conf's modules
    got, peak = _peak(download)
    assert got == size
    # Read whole into one response, the file peaked above its own size.
    assert peak < size / 4, f"serving the content peaked at {peak} bytes for a {size}-byte file"


def test_the_output_counts_against_the_storage_cap_and_the_rest_fail(client_for, settings, workers):
    from django.db.models import Sum

    from controlplane.batches.models import BatchLine, StoredFile

    tenant, client = client_for()
    data = _jsonl([_line(f"q-{i}") for i in range(6)])
    source = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    room = 1000  # two or three of the fake worker's answers (about 400 bytes each), not six
    settings.TESSERA_FILES_TENANT_MAX_BYTES = len(data) + room
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert _run(batch.id) == "completed"

    done = client.batches.retrieve(batch.id)
    assert done.error_file_id, "every answer was stored: the output was not counted against the cap"
    output = client.files.content(done.output_file_id).read()
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).read().splitlines()]
    kept = [json.loads(x)["custom_id"] for x in output.splitlines()]
    assert len(output) <= room and 1 <= len(kept) < 6
    assert kept == [f"q-{i}" for i in range(len(kept))]  # in line order, then the rest fail
    assert [e["custom_id"] for e in errors] == [f"q-{i}" for i in range(len(kept), 6)]
    assert {e["error"]["code"] for e in errors} == {"storage_quota_exceeded"}
    assert all(e["response"] is None and "storage cap" in e["error"]["message"] for e in errors)
    assert (done.request_counts.completed, done.request_counts.failed) == (len(kept), 6 - len(kept))
    assert BatchLine.objects.filter(batch_id=batch.id, state="failed").count() == 6 - len(kept)
    # Input and output within the cap; only the error file (it says what became of each line) passes it.
    error_bytes = client.files.retrieve(done.error_file_id).bytes
    stored = StoredFile.objects.filter(tenant_id=tenant.pk).aggregate(n=Sum("bytes"))["n"]
    assert stored - error_bytes <= settings.TESSERA_FILES_TENANT_MAX_BYTES
    with pytest.raises(openai.APIStatusError) as exc:  # and the tenant's uploads see it full
        client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("more")]))), purpose="batch")
    assert exc.value.status_code == 413 and exc.value.code == "storage_quota_exceeded"


def test_a_line_whose_answer_passes_the_cap_fails_with_output_too_large(client_for, settings, workers):
    tenant, client = client_for()
    settings.TESSERA_BATCH_MAX_LINE_OUTPUT_BYTES = 3000
    # The fake worker answers max_tokens tokens of "tN ": 4 tokens are ~350 bytes, 1,000 are ~6 kB.
    lines = [_line("small"), _line("big", max_tokens=1000), _line("small-2")]
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert _run(batch.id) == "completed"

    done = client.batches.retrieve(batch.id)
    assert done.error_file_id, "every answer was stored: no cap on one line's answer"
    output = [json.loads(x) for x in client.files.content(done.output_file_id).read().splitlines()]
    (error,) = [json.loads(x) for x in client.files.content(done.error_file_id).read().splitlines()]
    assert [o["custom_id"] for o in output] == ["small", "small-2"]
    assert error["custom_id"] == "big" and error["error"]["code"] == "output_too_large"
    assert error["response"]["status_code"] == 413 and error["response"]["body"]["error"]["code"] == "output_too_large"
    assert "3000" in error["error"]["message"]
    # Sent once (a 4xx is not retried) and billed once: the worker did the work.
    sent = [r for w in workers for r in w.received if r.path.endswith("/chat/completions")]
    assert len(sent) == 3
    assert len([e for e in sink.EVENTS if e.tenant_id == tenant.pk]) == 3
