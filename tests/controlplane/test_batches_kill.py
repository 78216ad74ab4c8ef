"""A real Celery worker (a process, over Redis) runs a batch and is SIGKILLed mid-batch; a second one
picks the batch up once its lease has passed and finishes it: every custom_id answered once in the
output file and billed once in the ledger (one row per line, under the line's request id)."""

from __future__ import annotations

import io
import json
import signal
import sys
import time
import uuid

import openai
import pytest

from .deployments.live import Process, database_url

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

LINES = 24


def _jsonl(n: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"kill-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "fake-model", "max_tokens": 10,
                                         "messages": [{"role": "user", "content": f"q{i}"}]}}).encode() + b"\n"
                    for i in range(n))


def _celery(env: dict) -> Process:
    return Process("batch-celery", [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool", "solo",
                                    "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "warning"],
                   env)


def _wait(predicate, timeout: float, what: str, process: Process | None = None):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f"\n{process.logs()}" if process else ""))
        time.sleep(0.1)
    return value


def test_celery_worker_killed_mid_batch_then_restarted_answers_and_bills_each_line_once(
        live_gateway, tenant_key, workers, redis_url, settings, tmp_path):
    from celery import Celery
    from django.conf import settings as django_settings

    from billing.models import UsageRecord
    from controlplane.batches.models import Batch, BatchLine

    settings.TESSERA_FILES_DIR = str(tmp_path / "files")
    for worker in workers:
        worker.token_delay = 0.03  # ~0.3 s a line: the kill lands mid-batch
    _, secret = tenant_key.sync(requests_per_minute=10_000)
    client = openai.OpenAI(base_url=f"{live_gateway}/v1", api_key=secret, max_retries=0, timeout=30)
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(LINES))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")

    queue = f"batches-{uuid.uuid4().hex[:8]}"
    broker = redis_url.rsplit("/", 1)[0] + "/14"
    env = {**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base",
           "DATABASE_URL": database_url(), "CELERY_BROKER_URL": broker, "TESSERA_CONTROL_QUEUE": queue,
           "TESSERA_WORKERS": ",".join(w.url for w in workers), "TESSERA_WORKER_TOKEN": "worker-secret",
           "TESSERA_VAR_DIR": str(tmp_path), "TESSERA_FILES_DIR": str(tmp_path / "files"),
           "TESSERA_LIMITER": "database", "TESSERA_BATCH_CONCURRENCY": "4", "TESSERA_BATCH_LEASE_SECONDS": "3",
           "TESSERA_API_KEY_SECRET": django_settings.TESSERA_API_KEY_SECRET, "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    sender = Celery(broker=broker)
    first = _celery(env)
    try:
        sender.send_task("batches.run", args=[batch.id], queue=queue)
        done = lambda: BatchLine.objects.filter(batch_id=batch.id, state="succeeded").count()  # noqa: E731
        _wait(lambda: done() >= 4, 60, "the first lines", first)
        first.stop(signal.SIGKILL)
        answered_before = done()
        assert answered_before < LINES, "the batch finished before the kill"
        assert BatchLine.objects.filter(batch_id=batch.id, state="running").exists()  # killed mid-line

        second = _celery(env)
        try:
            sender.send_task("batches.run", args=[batch.id], queue=queue)
            _wait(lambda: Batch.objects.get(pk=batch.id).status == "completed", 90, "the batch to complete", second)
        finally:
            second.stop()
    finally:
        first.stop(signal.SIGKILL)

    finished = client.batches.retrieve(batch.id)
    assert (finished.request_counts.completed, finished.request_counts.failed) == (LINES, 0)
    output = [json.loads(x) for x in client.files.content(finished.output_file_id).read().splitlines()]
    assert sorted(o["custom_id"] for o in output) == sorted(f"kill-{i}" for i in range(LINES))  # each once
    lines = {line.request_id: line for line in BatchLine.objects.filter(batch_id=batch.id)}
    records = list(UsageRecord.objects.filter(batch_id=batch.id))
    assert sorted(r.request_id for r in records) == sorted(lines)  # one ledger row per line, none extra
    assert all(r.completion_tokens > 0 for r in records)
    assert {o["response"]["request_id"] for o in output} == set(lines)
