"""A batch's output within bounds: finalize writes the output file line by line (memory holds a few
lines, not the output), `GET /v1/files/{id}/content` streams it, the output counts against the
tenant's storage cap (the runner sends no line once the batch's stored answers reach it, the unsent
lines failing `storage_quota_exceeded` unbilled; finalize fails the answered lines past it), and one
line's answer may be at most TESSERA_BATCH_MAX_LINE_OUTPUT_BYTES (a larger one fails `output_too_large`)."""

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
from .test_batches_api import _event

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
    """Finalize's exact check, behind the runner's: the six lines go out in one claim (concurrency 16),
    before any answer is known, and the answers past the cap are dropped there."""
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


# --- The runner stops at the cap: no line is sent, answered and billed for an answer that cannot be kept ---


@pytest.fixture
def ledger(gateway):
    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"  # the real ledger


def _sent(workers) -> list:
    return [r for w in workers for r in w.received if r.path.endswith("/chat/completions")]


def _file(client, file_id: str) -> list[dict]:
    return [json.loads(x) for x in client.files.content(file_id).read().splitlines()]


def _batch(client, custom_ids: list[str]):
    data = _jsonl([_line(c) for c in custom_ids])
    source = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"), data


def _custom_ids_sent(batch_id: str, workers) -> set[str]:
    from controlplane.batches.models import BatchLine

    by_request = dict(BatchLine.objects.filter(batch_id=batch_id).values_list("request_id", "custom_id"))
    return {by_request[r.headers["x-request-id"]] for r in _sent(workers) if r.headers["x-request-id"] in by_request}


def _over_cap(errors: list[dict], sent: set[str]) -> tuple[list[str], list[str]]:
    """The error file's quota lines: (answered and billed past the cap, never sent)."""
    assert all(e["error"]["code"] == "storage_quota_exceeded" and e["response"] is None for e in errors)
    answered = [e["custom_id"] for e in errors if e["custom_id"] in sent]
    unsent = [e["custom_id"] for e in errors if e["custom_id"] not in sent]
    assert all("answered (and billed)" in e["error"]["message"] for e in errors if e["custom_id"] in sent)
    assert all("not run (nothing was billed)" in e["error"]["message"] and "storage cap" in e["error"]["message"]
               for e in errors if e["custom_id"] not in sent)
    return answered, unsent


@pytest.mark.parametrize("concurrency", [1, 4])
def test_the_runner_sends_no_line_once_the_answers_reach_the_storage_cap(
        client_for, settings, workers, ledger, concurrency):
    """Checked only at finalize, every line past the cap was still sent, answered and billed, then dropped.
    Now the runner stops sending once the batch's stored answers reach the cap: only the lines in flight
    then may pass it (at most TESSERA_BATCH_CONCURRENCY), and the unsent ones fail, unbilled."""
    from billing.models import UsageRecord

    settings.TESSERA_BATCH_CONCURRENCY = concurrency
    tenant, client = client_for()
    ids = [f"q-{i}" for i in range(12)]
    batch, data = _batch(client, ids)
    settings.TESSERA_FILES_TENANT_MAX_BYTES = len(data) + 1000  # two of the fake worker's answers (~480 B), not 12
    assert _run(batch.id) == "completed"

    sent = _custom_ids_sent(batch.id, workers)
    assert len(_sent(workers)) == len(sent), "a line was sent twice"
    done = client.batches.retrieve(batch.id)
    kept = [o["custom_id"] for o in _file(client, done.output_file_id)]
    answered_over, unsent = _over_cap(_file(client, done.error_file_id), sent)
    assert 1 <= len(kept) <= 2 and set(kept) <= sent
    assert len(sent) < len(ids), "every line was sent: the runner did not stop at the storage cap"
    # Past the cap, only the lines in flight when it was reached: one at a time near the cap.
    assert 1 <= len(answered_over) <= concurrency and len(sent) == len(kept) + len(answered_over)
    if concurrency == 1:
        assert kept + answered_over == ids[:len(sent)] and unsent == ids[len(sent):]  # in line order
    assert sorted(unsent) == sorted(set(ids) - sent)
    assert (done.request_counts.completed, done.request_counts.failed) == (len(kept), len(ids) - len(kept))
    # Billed once per line sent, and for nothing else.
    records = UsageRecord.objects.filter(batch_id=batch.id)
    assert records.count() == len(sent) == len(set(records.values_list("batch_line", flat=True)))


def test_near_the_cap_the_runner_sends_only_what_the_room_left_holds(client_for, settings, workers, ledger):
    """Four lines in flight at a time, room for five and a half answers: once an answer's size is known,
    no more lines are out than the room left holds, so only the last one, sent alone, passes the cap
    (sending four at a time to the end, three or four would)."""
    settings.TESSERA_BATCH_CONCURRENCY = 4
    _, client = client_for()
    ids = [f"n-{i}" for i in range(16)]
    batch, data = _batch(client, ids)
    settings.TESSERA_FILES_TENANT_MAX_BYTES = len(data) + 2700  # answers of ~480 B
    assert _run(batch.id) == "completed"

    sent = _custom_ids_sent(batch.id, workers)
    done = client.batches.retrieve(batch.id)
    kept = [o["custom_id"] for o in _file(client, done.output_file_id)]
    answered_over, unsent = _over_cap(_file(client, done.error_file_id), sent)
    assert len(kept) == 5 and len(answered_over) == 1 and len(sent) == 6 and len(unsent) == 10


def _answered_by_a_dead_runner(batch_id: str, count: int, billed_lost: int = 0) -> None:
    """What a runner killed mid-batch leaves: `count` lines sent through the gateway and answered by the
    runner's own code, `billed_lost` more served and billed but not answered (left `running`), the
    batch still in progress, its lease passed."""
    from billing.services import usage_record_ingest
    from controlplane.batches import lines, principal
    from controlplane.batches.models import Batch
    from controlplane.batches.send import send
    from controlplane.batches.services import batch_validate
    from controlplane.gateway import upstream
    from controlplane.gateway.routing.workers import get_registry
    from controlplane.gateway.usage import accounting

    batch_validate(batch_id=batch_id)
    batch = Batch.objects.get(pk=batch_id)
    key_hash = principal.key_hash_of(batch.api_key_id)
    claimed = lines.line_claim(batch_id=batch_id, limit=count + billed_lost)
    for line in claimed[count:]:
        usage_record_ingest(event=_event(batch.tenant_id, line.request_id, batch_id))
    claimed = claimed[:count]

    async def answer() -> None:
        await get_registry().ensure_polling()
        sender = await principal.current(key_hash)
        try:
            for line in claimed:
                await send(batch, sender, line)
            await accounting.drain()
        finally:
            await upstream.close()

    async_to_sync(answer)()


def test_a_resumed_batch_counts_the_answers_stored_before_it(client_for, settings, workers, ledger):
    from billing.models import UsageRecord

    """A dead runner answered r-0 and r-1 and was billed for r-2, whose answer it lost. The next runner
    counts the stored answers (over the cap) and sends nothing: r-2, billed, says so; r-3.. were not run."""
    tenant, client = client_for()
    ids = [f"r-{i}" for i in range(6)]
    batch, data = _batch(client, ids)
    _answered_by_a_dead_runner(batch.id, 2, billed_lost=1)
    assert len(_sent(workers)) == 2
    settings.TESSERA_FILES_TENANT_MAX_BYTES = len(data) + 600  # one answer (~480 B) fits, two do not
    assert _run(batch.id) == "completed"

    assert len(_sent(workers)) == 2, "the resumed runner sent lines past the cap: it did not count the stored answers"
    done = client.batches.retrieve(batch.id)
    assert [o["custom_id"] for o in _file(client, done.output_file_id)] == ["r-0"]
    answered_over, unsent = _over_cap(_file(client, done.error_file_id), {"r-0", "r-1", "r-2"})
    assert answered_over == ["r-1", "r-2"] and unsent == ids[3:]
    assert UsageRecord.objects.filter(batch_id=batch.id).count() == 3


def test_the_tenants_other_running_batches_answers_count_too(client_for, settings, workers, ledger):
    """Answers of another batch of the tenant, still running, become files at its end: counted now (as
    its runner published them with its lease), not first at that batch's finalize."""
    from controlplane.batches import lines
    from controlplane.batches.models import BatchLine

    settings.TESSERA_BATCH_CONCURRENCY = 1
    tenant, client = client_for()
    other, other_data = _batch(client, ["o-0", "o-1", "o-2"])
    _answered_by_a_dead_runner(other.id, 2)
    published = sum(BatchLine.objects.filter(batch_id=other.id).values_list("output_bytes", flat=True))
    lines.lease_renew(batch_id=other.id, output_bytes=published)  # as its runner does every second
    ids = [f"b-{i}" for i in range(6)]
    batch, data = _batch(client, ids)
    # Room for the other batch's two answers (~480 B each) and one and a half of this one's.
    settings.TESSERA_FILES_TENANT_MAX_BYTES = len(other_data) + len(data) + 1700
    assert _run(batch.id) == "completed"

    sent = _custom_ids_sent(batch.id, workers)
    done = client.batches.retrieve(batch.id)
    kept = [o["custom_id"] for o in _file(client, done.output_file_id)]
    answered_over, unsent = _over_cap(_file(client, done.error_file_id), sent)
    # Counted alone (1,700 bytes of room), it would have sent four lines and kept three, in the room the
    # other batch's answers will take at its end.
    assert sorted(sent) == kept == ids[:2] and answered_over == [] and unsent == ids[2:]
