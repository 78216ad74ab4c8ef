"""End to end: the official `openai` client uploads a batch file and creates a batch through the
gateway; the batch runs against a real SmolLM2 worker until `completed` (through in_progress and
finalizing), each line answered in the output file, and its usage is billed on the batch price line."""

from __future__ import annotations

import io
import json
import threading
import time
from decimal import Decimal

import openai
import pytest
from asgiref.sync import async_to_sync

from tests.dataplane.worker.process import MODEL, running

from .conftest import serving_gateway

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def real_worker():
    with running() as worker:
        yield worker


def test_files_and_batches_with_the_openai_client_against_a_real_worker(real_worker, gateway, tenant_key, tmp_path):
    import datetime as dt

    from billing.models import UsageRecord
    from billing.services.prices import price_create
    from controlplane.batches.runner import run

    gateway.TESSERA_FILES_DIR = str(tmp_path / "files")
    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"
    price_create(model=MODEL, input_per_mtok=Decimal("2"), cached_input_per_mtok=Decimal("1"),
                 output_per_mtok=Decimal("4"), effective_from=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    _, secret = tenant_key.sync(requests_per_minute=1000)
    questions = ["Name a colour.", "Name a fruit.", "Say hello.", "Count to three."]
    with serving_gateway(gateway, real_worker) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=120)
        lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 8,
                           "temperature": 0}} for i, q in enumerate(questions)]
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        source = client.files.create(file=("questions.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        runner = threading.Thread(target=async_to_sync(run), args=(batch.id,))  # what the Celery task calls
        runner.start()
        seen = set()
        deadline = time.monotonic() + 120
        while (current := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
            seen.add(current.status)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        runner.join()
        assert current.status == "completed", current
        assert seen <= {"validating", "in_progress", "finalizing"}
        output = {o["custom_id"]: o for o in map(json.loads, client.files.content(current.output_file_id).read()
                                                  .splitlines())}
        assert current.error_file_id is None and set(output) == {"q0", "q1", "q2", "q3"}
        for line in lines:
            answer = output[line["custom_id"]]["response"]["body"]
            assert answer["object"] == "chat.completion" and answer["model"] == MODEL
            assert answer["choices"][0]["message"]["content"] and 1 <= answer["usage"]["completion_tokens"] <= 8
    records = UsageRecord.objects.filter(batch_id=batch.id)
    assert records.count() == 4
    for record in records:  # the batch line: half the online price (the default batch share)
        assert record.amount == (Decimal(record.prompt_tokens - record.cached_tokens) * 2 + record.cached_tokens * 1
                                 + record.completion_tokens * 4) / 2 / 1_000_000


def test_data_plane_worker_killed_mid_batch_then_restarted(gateway, tenant_key, tmp_path, monkeypatch):
    """SIGKILL the worker with lines in flight, start it again on the same port: the batch completes,
    every custom_id answered once, and the ledger holds one row with tokens per line (the killed
    attempts bill nothing: the worker's counts died with it)."""
    import signal

    from billing.models import UsageRecord
    from controlplane.batches.models import Batch, BatchLine
    from controlplane.batches.runner import run
    from tests.dataplane.worker import process

    gateway.TESSERA_FILES_DIR = str(tmp_path / "files")
    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"
    gateway.TESSERA_BATCH_CONCURRENCY = 2
    gateway.TESSERA_WORKER_POLL_SECONDS = 0.5
    worker = process.WorkerProcess()
    worker.wait_ready()
    n = 10
    try:
        _, secret = tenant_key.sync(requests_per_minute=1000)
        with serving_gateway(gateway, worker) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=120)
            data = b"".join(json.dumps({"custom_id": f"w{i}", "method": "POST", "url": "/v1/chat/completions",
                                        "body": {"model": MODEL, "max_tokens": 48, "temperature": 0, "messages": [
                                            {"role": "user", "content": f"Write a story about the number {i}."}]}})
                            .encode() + b"\n" for i in range(n))
            source = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
            batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                          completion_window="24h")
            runner = threading.Thread(target=async_to_sync(run), args=(batch.id,))
            runner.start()
            deadline = time.monotonic() + 120
            while BatchLine.objects.filter(batch_id=batch.id, state="succeeded").count() < 2:
                assert time.monotonic() < deadline and runner.is_alive()
                time.sleep(0.05)
            port = int(worker.url.rsplit(":", 1)[1])
            worker.proc.send_signal(signal.SIGKILL)
            worker.proc.wait()
            assert BatchLine.objects.filter(batch_id=batch.id, state__in=["pending", "running"]).exists()
            monkeypatch.setattr(process, "free_port", lambda: port)
            worker = process.WorkerProcess()  # restarted on the same address
            worker.wait_ready()
            runner.join(180)
            assert not runner.is_alive()
            done = client.batches.retrieve(batch.id)
            assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (n, 0)
            output = [json.loads(x) for x in client.files.content(done.output_file_id).read().splitlines()]
            assert sorted(o["custom_id"] for o in output) == sorted(f"w{i}" for i in range(n))
        assert Batch.objects.get(pk=batch.id).status == "completed"
        retried = BatchLine.objects.filter(batch_id=batch.id, attempts__gt=1).count()
        billed = UsageRecord.objects.filter(batch_id=batch.id).exclude(prompt_tokens=0, completion_tokens=0)
        lines = dict(BatchLine.objects.filter(batch_id=batch.id).values_list("custom_id", "request_id"))
        assert sorted(billed.values_list("request_id", flat=True)) == sorted(lines.values())  # once per line
        # Whether the kill cost a line an attempt depends on where each in-flight line was (mid-stream: a
        # retried attempt; before its first byte: sent again without one): not asserted.
        print(f"lines retried after the kill: {retried}")
    finally:
        worker.stop()


def test_a_completions_line_whose_echoed_prompt_holds_a_nul_is_answered_and_billed_once(
        real_worker, gateway, tenant_key, tmp_path):
    """Token 190 of SmolLM2's byte-level vocabulary ("Ā") decodes to byte 0: echoed, the answer holds a
    NUL. PostgreSQL's jsonb refused to store it and the runner sent the line again every 2 s, billed
    each time, for the batch's whole window (here bounded to 30 s); it is now stored as the model
    answered it."""
    import datetime as dt

    from django.utils import timezone

    from billing.models import UsageRecord
    from controlplane.batches.models import Batch, BatchLine
    from controlplane.batches.runner import run

    gateway.TESSERA_FILES_DIR = str(tmp_path / "files")
    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"
    _, secret = tenant_key.sync(requests_per_minute=1000)
    with serving_gateway(gateway, real_worker) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=120)
        line = {"custom_id": "nul", "method": "POST", "url": "/v1/completions",
                "body": {"model": MODEL, "prompt": [19556, 190], "echo": True, "max_tokens": 2, "temperature": 0}}
        source = client.files.create(file=("nul.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")),
                                     purpose="batch")
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
        Batch.objects.filter(pk=batch.id).update(expires_at=timezone.now() + dt.timedelta(seconds=30))
        status = async_to_sync(run)(batch.id)
        assert UsageRecord.objects.filter(batch_id=batch.id).count() == 1
        assert BatchLine.objects.get(batch_id=batch.id).attempts == 1  # sent once
        assert status == "completed"
        (answer,) = map(json.loads, client.files.content(client.batches.retrieve(batch.id).output_file_id)
                        .read().splitlines())
        assert answer["response"]["body"]["choices"][0]["text"].startswith("Hello\x00")
