"""No input file can strand a batch: what a line's row cannot store (U+0000, which PostgreSQL refuses
in text and jsonb) is refused at upload naming the line, and a batch from such a file (stored under
older rules) fails naming the line; a refusal the checks miss fails the batch too; a batch still
`validating` when its window passes expires; the resume sweep takes stranded batches oldest first,
tenants in turns, so that one tenant's stranded batches cannot starve another's."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid

import openai
import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)


def _line(custom_id: str, content: str = "hi") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "fake-model", "messages": [{"role": "user", "content": content}], "max_tokens": 4}}


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)  # json.dumps writes NUL as \u0000


@pytest.fixture
def client_for(live_gateway, tenant_key, settings, tmp_path):
    settings.TESSERA_FILES_DIR = str(tmp_path / "files")

    def make():
        tenant, secret = tenant_key.sync(requests_per_minute=10_000)
        return tenant, openai.OpenAI(base_url=f"{live_gateway}/v1", api_key=secret, max_retries=0, timeout=30)

    return make


def _run(batch_id: str) -> str:
    from controlplane.batches.runner import run

    return async_to_sync(run)(batch_id)


@pytest.mark.parametrize(("line", "where"), [
    ({**_line("a\x00b")}, "custom_id"),
    (_line("ok", "before\x00after"), "body.messages[0].content"),
    ({**_line("ok"), "body": {"model": "fake-model", "messages": [], "logit_bias": {"\x00": 1}}},
     "a key of body.logit_bias"),
])
def test_an_upload_whose_line_cannot_be_stored_is_a_400_naming_the_line(client_for, line, where):
    _, client = client_for()
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("first"), line]))), purpose="batch")
    assert exc.value.code == "invalid_file" and exc.value.param == "file"
    assert "Line 2 " in exc.value.message and where in exc.value.message and "NUL" in exc.value.message
    assert client.files.list().data == []
    # An escaped backslash before "u0000" is no NUL: such a line is stored.
    client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("x", "\\u0000")]))), purpose="batch")


def _stored_file(tenant_id: int, data: bytes) -> str:
    """A file as an upload before the upload checked for NUL stored it (straight through the storage)."""
    from django.core.files.base import ContentFile

    from controlplane.batches.models import StoredFile
    from controlplane.batches.storage import files_storage

    file_id = f"file-{uuid.uuid4().hex[:24]}"
    name = files_storage().save(f"{tenant_id}/{file_id}", ContentFile(data))
    StoredFile.objects.create(id=file_id, tenant_id=tenant_id, purpose="batch", filename="old.jsonl", bytes=len(data),
                              lines=data.count(b"\n"), storage_name=name)
    return file_id


def test_a_batch_whose_line_cannot_be_stored_fails_naming_the_line(client_for, workers):
    from controlplane.batches.models import Batch, BatchLine

    tenant, client = client_for()
    file_id = _stored_file(tenant.pk, _jsonl([_line("fine"), _line("bad", "x\x00y"), _line("nul\x00id")]))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert _run(batch.id) == "failed"  # on PostgreSQL the rows' insert raised DataError: validating for ever
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.failed_at
    assert [(e.code, e.line, e.param) for e in failed.errors.data] == [
        ("invalid_body", 2, "body.messages[0].content"), ("invalid_custom_id", 3, "custom_id")]
    assert all("NUL" in e.message for e in failed.errors.data)
    assert not BatchLine.objects.filter(batch_id=batch.id).exists()
    assert Batch.objects.get(pk=batch.id).status == "failed"
    assert not [r for w in workers for r in w.received]


@pytest.mark.postgres
def test_a_refusal_the_checks_miss_fails_the_batch_instead_of_stranding_it(client_for, monkeypatch):
    """Whatever else the database may refuse: the batch fails with the database's reason, once."""
    from controlplane.batches import storable

    if connection.vendor != "postgresql":
        pytest.skip("SQLite stores U+0000: nothing to refuse")
    monkeypatch.setattr(storable, "line_nul_at", lambda raw, item: None)  # a value no check knows of
    tenant, client = client_for()
    file_id = _stored_file(tenant.pk, _jsonl([_line("fine"), _line("bad", "x\x00y")]))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert _run(batch.id) == "failed"
    (error,) = client.batches.retrieve(batch.id).errors.data
    assert error.code == "invalid_file" and "could not be stored" in error.message
    assert "\\u0000" in error.message or "Unicode" in error.message  # PostgreSQL's own words


def test_a_batch_still_validating_when_its_window_passes_expires(client_for, monkeypatch):
    from controlplane.batches import tasks
    from controlplane.batches.models import Batch

    sent: list[str] = []
    monkeypatch.setattr(tasks.batch_run, "delay", sent.append)  # the broker is not the subject here
    tenant, client = client_for()
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line("a")]))), purpose="batch")
    stale, late = (client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                         completion_window="24h") for _ in range(2))
    Batch.objects.filter(pk__in=[stale.id, late.id]).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    sent.clear()

    assert stale.id not in tasks.batches_resume()  # the sweep expires it rather than enqueue it for ever
    expired = client.batches.retrieve(stale.id)
    assert expired.status == "expired" and expired.expired_at
    assert [e.code for e in expired.errors.data] == ["batch_expired"]
    assert sent == []
    # A runner that reaches one first expires it too (its window is over: nothing is run).
    Batch.objects.filter(pk=late.id).update(status="validating", expired_at=None, errors=None)
    assert _run(late.id) == "expired"


def _stranded(tenant, n: int, start: dt.datetime) -> list[str]:
    from controlplane.batches.models import Batch

    ids = [f"batch_{uuid.uuid4().hex[:24]}" for _ in range(n)]
    Batch.objects.bulk_create([Batch(id=i, tenant=tenant, endpoint="/v1/chat/completions", input_file_id="file-x",
                                     status=Batch.Status.VALIDATING, expires_at=start + dt.timedelta(hours=24))
                               for i in ids])
    for k, batch_id in enumerate(ids):  # created_at is auto_now_add: set it after
        Batch.objects.filter(pk=batch_id).update(created_at=start + dt.timedelta(seconds=k))
    return ids


def test_resume_takes_each_tenants_oldest_first_tenants_in_turns(gateway, tenant_key, monkeypatch):
    """150 stranded batches of one tenant, older than another tenant's 3: a sweep of 100 takes both
    tenants' oldest in turns, so the second tenant's batches are all resumed by the first sweep."""
    from controlplane.batches import tasks

    monkeypatch.setattr(tasks.batch_run, "delay", lambda batch_id: None)
    noisy, _ = tenant_key.sync()
    quiet, _ = tenant_key.sync()
    now = timezone.now()
    many = _stranded(noisy, 150, now - dt.timedelta(hours=2))
    few = _stranded(quiet, 3, now - dt.timedelta(hours=1))

    taken = tasks.batches_resume()
    assert len(taken) == 100
    assert set(few) <= set(taken)
    assert taken[:6] == [many[0], few[0], many[1], few[1], many[2], few[2]]
    assert taken[6:] == many[3:97]  # then the rest of the noisy tenant's, oldest first
