"""/v1/files and /v1/batches through the gateway with the official `openai` client (fake workers):
upload, caps, tenant isolation, a batch run to `completed` with its output and error files, cancel,
the exactly-once recovery of a dead runner's lines, and batch lines' priority and usage marking."""

from __future__ import annotations

import io
import json

import openai
import pytest
from asgiref.sync import async_to_sync

from . import sink

pytestmark = pytest.mark.django_db(transaction=True)


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _line(custom_id: str, content: str = "hi", model: str = "fake-model", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **body}}


@pytest.fixture
def files_dir(settings, tmp_path):
    settings.TESSERA_FILES_DIR = str(tmp_path / "files")
    return tmp_path / "files"


@pytest.fixture
def client_for(live_gateway, tenant_key, files_dir):
    def make(**tier_fields):
        tier_fields.setdefault("requests_per_minute", 10_000)
        tenant, secret = tenant_key.sync(**tier_fields)
        return tenant, openai.OpenAI(base_url=f"{live_gateway}/v1", api_key=secret, max_retries=0, timeout=30)

    return make


def _run(batch_id: str) -> str:
    from controlplane.batches.runner import run

    return async_to_sync(run)(batch_id)


def test_files_upload_list_content_delete_and_isolation(client_for, files_dir):
    tenant, client = client_for()
    _, other = client_for()
    data = _jsonl([_line("a"), _line("b")])
    created = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert created.id.startswith("file-") and created.bytes == len(data) and created.purpose == "batch"
    assert (files_dir / str(tenant.pk) / created.id).read_bytes() == data  # stored through the storage API
    assert [f.id for f in client.files.list().data] == [created.id]
    assert client.files.retrieve(created.id).filename == "in.jsonl"
    assert client.files.content(created.id).read() == data

    assert other.files.list().data == []
    for call in (other.files.retrieve, other.files.content, other.files.delete):
        with pytest.raises(openai.NotFoundError):  # another tenant's file: 404, never 403
            call(created.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.create(input_file_id=created.id, endpoint="/v1/chat/completions", completion_window="24h")

    assert client.files.delete(created.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
    assert not (files_dir / str(tenant.pk) / created.id).exists()


def test_files_refuse_bad_uploads_and_caps(client_for, settings):
    _, client = client_for()
    for purpose, data, code in [
        ("fine-tune", _jsonl([_line("a")]), "invalid_value"),
        ("batch", b"not json\n", "invalid_file"),
        ("batch", b"[1, 2]\n", "invalid_file"),
        ("batch", b"\xff\xfe\n", "invalid_file"),
        ("batch", b"\n\n", "invalid_file"),
    ]:
        with pytest.raises(openai.BadRequestError) as exc:
            client.files.create(file=("x.jsonl", io.BytesIO(data)), purpose=purpose)
        assert exc.value.code == code, (purpose, data)
    settings.TESSERA_FILES_MAX_LINES = 2
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(file=("x.jsonl", io.BytesIO(_jsonl([_line(str(i)) for i in range(3)]))), purpose="batch")
    assert exc.value.code == "too_many_lines"
    settings.TESSERA_FILES_MAX_BYTES = 100
    with pytest.raises(openai.APIStatusError) as exc:
        client.files.create(file=("x.jsonl", io.BytesIO(_jsonl([_line("a", "x" * 200)]))), purpose="batch")
    assert exc.value.status_code == 413
    settings.TESSERA_FILES_MAX_BYTES = 10_000
    settings.TESSERA_FILES_TENANT_MAX_BYTES = 300
    client.files.create(file=("x.jsonl", io.BytesIO(_jsonl([_line("a")]))), purpose="batch")
    with pytest.raises(openai.APIStatusError) as exc:
        client.files.create(file=("x.jsonl", io.BytesIO(_jsonl([_line("b"), _line("c")]))), purpose="batch")
    assert exc.value.status_code == 413 and exc.value.code == "storage_quota_exceeded"


def test_batch_runs_to_completed_with_output_and_error_files(client_for, workers):
    tenant, client = client_for()
    lines = [_line(f"req-{i}", f"question {i}") for i in range(5)] + [_line("bad-model", model="no-such-model")]
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "nightly"})
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}

    assert _run(batch.id) == "completed"
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.completed_at and done.finalizing_at and done.in_progress_at
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 5, 1)
    output = [json.loads(x) for x in client.files.content(done.output_file_id).read().splitlines()]
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(5)]
    assert all(o["response"]["status_code"] == 200 and o["response"]["body"]["choices"] for o in output)
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).read().splitlines()]
    assert [(e["custom_id"], e["response"]["status_code"], e["error"]["code"]) for e in errors] == [
        ("bad-model", 404, "model_not_found")]

    sent = [r for w in workers for r in w.received if r.path.endswith("/chat/completions")]
    assert len(sent) == 5 and {r.headers["x-priority"] for r in sent} == {"1000"}  # after every online tier
    assert [b.id for b in client.batches.list().data] == [batch.id]
    assert _run(batch.id) == "completed"  # a finished batch run again sends nothing
    assert len([r for w in workers for r in w.received if r.path.endswith("/chat/completions")]) == 5


def test_batch_usage_is_marked_with_the_batch(client_for, drain):
    tenant, client = client_for()
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("x"), _line("y")]))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    _run(batch.id)
    events = [e for e in sink.EVENTS if e.tenant_id == tenant.pk]
    assert len(events) == 2 and {e.batch_id for e in events} == {batch.id}
    assert all(e.request_id.startswith("req_b") for e in events)


def test_batch_validation_failures(client_for):
    _, client = client_for()
    bad = [_line("same"), _line("same"), {**_line("u"), "url": "/v1/embeddings"}, {**_line("s"), "body": {
        "model": "fake-model", "messages": [], "stream": True}}]
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(bad))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert _run(batch.id) == "failed"
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.failed_at
    assert [(e.code, e.line) for e in failed.errors.data] == [
        ("duplicate_custom_id", 2), ("mismatched_url", 3), ("invalid_body", 4)]
    for kwargs in ({"endpoint": "/v1/responses", "completion_window": "24h"},
                   {"endpoint": "/v1/chat/completions", "completion_window": "1h"}):
        with pytest.raises(openai.BadRequestError):
            client.batches.create(input_file_id=source.id, **kwargs)


def test_a_batch_has_one_endpoint(client_for, workers):
    """OpenAI's rule: every line's url is the batch's endpoint. A chat line in an embeddings batch (or
    an embeddings line in a chat batch) fails validation naming the line, and nothing is sent."""
    _, client = client_for()
    embedding = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": "fake-model", "input": "x"}}
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([embedding, _line("c")]))), purpose="batch")
    for endpoint, line in (("/v1/embeddings", 2), ("/v1/chat/completions", 1)):
        batch = client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h")
        assert batch.endpoint == endpoint
        assert _run(batch.id) == "failed"
        (error,) = client.batches.retrieve(batch.id).errors.data
        assert (error.code, error.line, error.param) == ("mismatched_url", line, "url")
        assert endpoint in error.message and "every line of a batch must use its endpoint" in error.message
    assert not [r for w in workers for r in w.received]


def test_cancel_keeps_answered_lines_and_stops_new_ones(client_for):
    from controlplane.batches.models import BatchLine

    _, client = client_for()
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line(f"c{i}") for i in range(4)]))),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    from controlplane.batches.services import batch_validate

    batch_validate(batch_id=batch.id)
    BatchLine.objects.filter(batch_id=batch.id, custom_id="c0").update(
        state="succeeded", status_code=200, response={"answered": True})  # answered before the cancel
    assert client.batches.cancel(batch.id).status == "cancelling"
    assert _run(batch.id) == "cancelled"
    done = client.batches.retrieve(batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 3)
    output = [json.loads(x) for x in client.files.content(done.output_file_id).read().splitlines()]
    assert [o["custom_id"] for o in output] == ["c0"]
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).read().splitlines()]
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    with pytest.raises(openai.ConflictError):
        _cancel_completed(client)


def _cancel_completed(client):
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("z")]))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    _run(batch.id)
    client.batches.cancel(batch.id)


def test_hard_budget_fails_the_line_with_the_budget_error(client_for):
    tenant, client = client_for(monthly_token_budget=200, budget_enforcement="hard")
    lines = [_line(f"b{i}", max_tokens=60) for i in range(5)]
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    _run(batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.request_counts.failed >= 1
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).read().splitlines()]
    assert errors and {e["error"]["code"] for e in errors} == {"insufficient_quota"}
    assert done.request_counts.completed + done.request_counts.failed == 5


def test_dead_runner_lines_are_answered_and_billed_once(client_for, gateway):
    """A runner killed mid-batch leaves lines `running` (one billed, one only journalled): the next
    runner re-sends the billed one under its own request id (the ledger keeps one row) and releases
    the other's journal row before sending it again under a new id."""
    import datetime as dt

    from billing.models import UsageRecord
    from billing.services import usage_record_ingest
    from controlplane.batches import lines as batch_lines
    from controlplane.batches.models import Batch, BatchLine
    from controlplane.batches.services import batch_validate
    from controlplane.gateway.models import InflightRequest

    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"
    tenant, client = client_for()
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line(f"k{i}") for i in range(3)]))),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch_validate(batch_id=batch.id)
    first, second = batch_lines.line_claim(batch_id=batch.id, limit=2)  # the dead runner's two lines
    Batch.objects.filter(pk=batch.id).update(lease_until=None)  # its lease passed
    usage_record_ingest(event=_event(tenant.pk, first.request_id, batch.id))  # served and billed, answer lost
    InflightRequest.objects.create(
        request_id=second.request_id, tenant_id=tenant.pk, model="fake-model", prompt_estimate=5,
        reserved_tokens=9, period_start=dt.date.today().replace(day=1), worker_url="http://gone",
        created_at=dt.datetime.now(dt.UTC))

    assert _run(batch.id) == "completed"
    rows = {line.custom_id: line for line in BatchLine.objects.filter(batch_id=batch.id)}
    assert rows["k0"].request_id == first.request_id and rows["k0"].attempts == 2
    assert rows["k1"].request_id != second.request_id
    assert not InflightRequest.objects.filter(request_id=second.request_id).exists()
    records = UsageRecord.objects.filter(tenant_id=tenant.pk)
    assert sorted(records.values_list("request_id", flat=True)) == sorted(r.request_id for r in rows.values())
    assert records.get(request_id=first.request_id).completion_tokens == 4  # the first write, once
    assert set(records.values_list("batch_id", flat=True)) == {batch.id}
    output = [json.loads(x) for x in client.files.content(client.batches.retrieve(batch.id).output_file_id)
              .read().splitlines()]
    assert sorted(o["custom_id"] for o in output) == ["k0", "k1", "k2"]


def _event(tenant_id, request_id, batch_id):
    import datetime as dt

    from billing.events import UsageEvent

    return UsageEvent(request_id=request_id, tenant_id=tenant_id, api_key_id=None, model="fake-model", adapter=None,
                      tier="t", prompt_tokens=7, cached_tokens=0, completion_tokens=4, ttft_ms=None, latency_ms=1.0,
                      status="ok", created_at=dt.datetime.now(dt.UTC), batch_id=batch_id)


def test_deleting_a_tenant_deletes_its_files_and_their_bytes(client_for, files_dir):
    from controlplane.batches.models import StoredFile

    tenant, client = client_for()
    created = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("a")]))), purpose="batch")
    assert (files_dir / str(tenant.pk) / created.id).exists()
    tenant.delete()
    assert not StoredFile.objects.filter(pk=created.id).exists()
    assert not (files_dir / str(tenant.pk) / created.id).exists()


@pytest.mark.parametrize(("waiting", "running", "outstanding", "room"), [
    (0, 0, 0, 12),  # idle: the seats and 4 queued
    (0, 8, 8, 4),  # all seats ours: 4 more may queue
    (0, 3, 0, 1),  # 3 online requests running: one line in all
    (0, 4, 1, 0),  # ... which it has
    (2, 0, 0, 0),  # an online request waits: none
    (2, 8, 10, 2),  # only our own lines wait (8 seats, 2 of ours queued): 2 more
    (3, 8, 10, 0),  # one of the waiting is not ours: none
])
def test_room_follows_what_online_traffic_leaves(gateway, waiting, running, outstanding, room):
    from controlplane.batches.runner import room as batch_room
    from controlplane.gateway.routing.workers import ModelTarget, get_registry

    registry = get_registry()
    worker, other = registry.workers
    other.ready = False
    worker.ready, worker.models = True, {"fake-model": ModelTarget("fake-model", "fake-model", None)}
    worker.seats, worker.waiting, worker.running, worker.outstanding = 8, waiting, running, outstanding
    assert batch_room("fake-model", in_flight=outstanding) == room


def test_files_and_batches_need_a_valid_key(live_gateway, files_dir):
    stranger = openai.OpenAI(base_url=f"{live_gateway}/v1", api_key="sk-nope-nope-nope-nope-nope", max_retries=0)
    for call in (stranger.files.list, stranger.batches.list, lambda: stranger.files.create(
            file=("x.jsonl", io.BytesIO(_jsonl([_line("a")]))), purpose="batch")):
        with pytest.raises(openai.AuthenticationError):
            call()


def test_a_batch_whose_key_was_revoked_fails_its_lines_with_the_keys_error(client_for, workers):
    from tenants.models import APIKey

    tenant, client = client_for()
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("r0"), _line("r1")]))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    APIKey.objects.filter(tenant=tenant).update(revoked=True)
    assert _run(batch.id) == "completed"
    from controlplane.batches.files import file_content
    from controlplane.batches.models import Batch

    finished = Batch.objects.get(pk=batch.id)  # the revoked key cannot read it through the API any more
    assert (finished.request_completed, finished.request_failed, finished.output_file_id) == (0, 2, "")
    _, data = file_content(tenant_id=tenant.pk, file_id=finished.error_file_id)
    assert {json.loads(x)["error"]["code"] for x in data.splitlines()} == {"invalid_api_key"}
    assert not [r for w in workers for r in w.received]  # nothing reached a worker
