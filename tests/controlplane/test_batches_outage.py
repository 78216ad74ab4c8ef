"""PostgreSQL stopped for 10 s while a 200-line batch runs, in real processes on a throwaway cluster:
a gateway (uvicorn) takes the file and the batch, a Celery worker runs it against the fake workers
with the Redis limiter. With `kill`, the Celery worker is also SIGKILLed while the database is away
(its served lines' usage only in its spool, their answers not stored) and another one takes over once
the database is back. Either way the batch completes with every custom_id answered once, and the
ledger holds exactly one row per line: a line re-sent after its runner died is not billed again.
"""

from __future__ import annotations

import io
import json
import signal
import sys
import time
import uuid

import openai
import psycopg
import pytest

from tests.throwaway_services import throwaway_postgres  # noqa: F401 (fixture)

from .deployments.live import Process
from .test_database_outage import _env, _manage, _spool_bytes, _start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.redis]

LINES = 200
OUTAGE = 10.0  # seconds PostgreSQL is down


def _jsonl() -> bytes:
    return b"".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "fake-model", "max_tokens": 8,
                                         "messages": [{"role": "user", "content": f"question {i}"}]}}).encode() + b"\n"
                    for i in range(LINES))


def _celery(env: dict) -> Process:
    return Process("batch-outage-celery", [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool",
                                           "solo", "--without-mingle", "--without-gossip", "--without-heartbeat",
                                           "-l", "warning"], env)


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.3)


def _query(url: str, sql: str, *args):
    with psycopg.connect(url.replace("postgres://", "postgresql://"), connect_timeout=5) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.mark.parametrize("kill", [False, True], ids=["outage", "outage-and-kill"])
def test_postgres_stopped_mid_batch_every_line_answered_once_and_billed_once(
        throwaway_postgres, redis_url, workers, tmp_path, kill):  # noqa: F811
    postgres = throwaway_postgres
    postgres.migrate()
    queue = f"batches-outage-{uuid.uuid4().hex[:8]}"
    broker = redis_url.rsplit("/", 1)[0] + "/14"
    env = {**_env(postgres.url, redis_url, tmp_path / "spool", workers),
           "CELERY_BROKER_URL": broker, "TESSERA_CONTROL_QUEUE": queue, "TESSERA_FILES_DIR": str(tmp_path / "files"),
           "TESSERA_BATCH_LEASE_SECONDS": "3", "TESSERA_BATCH_CONCURRENCY": "16", "PYTHONUNBUFFERED": "1"}
    for worker in workers:
        worker.token_delay = 0.05  # 8 tokens: 0.4 s a line, 16 at a time: the batch takes several seconds
    _manage(env, "tenant_create", "--name", "Batch Co", "--slug", "batchco", "--tier", "enterprise")
    secret = _manage(env, "key_create", "--tenant", "batchco", "--name", "batch")["api_key"]
    gateway, url, _ = _start_gateway(env)
    runners: list[Process] = []
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=30)
        source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl())), purpose="batch")
        runners.append(_celery(env))
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")  # enqueues its run on the queue
        answered = lambda: _query(postgres.url, "SELECT count(*) FROM batches_batchline WHERE batch_id = %s "  # noqa: E731
                                  "AND state = 'succeeded'", batch.id)[0][0]
        wait_for(lambda: answered() >= 30, timeout=90)
        postgres.stop()
        stopped = time.monotonic()
        if kill:
            time.sleep(4)
            runners[0].stop(signal.SIGKILL)  # its served lines' answers die with it; their usage is in its spool
            runners.append(_celery(env))
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped)))
        postgres.start()
        if kill:  # the dead worker's task is not acknowledged: ask again, as the beat's resume sweep would
            from celery import Celery

            Celery(broker=broker).send_task("batches.run", args=[batch.id], queue=queue)
        status = lambda: _query(postgres.url, "SELECT status FROM batches_batch WHERE id = %s", batch.id)[0][0]  # noqa: E731
        try:
            wait_for(lambda: status() == "completed", timeout=180)
        except Exception:
            raise AssertionError(f"the batch did not complete ({status()}):\n{runners[-1].logs()}") from None
        wait_for(lambda: _spool_bytes(tmp_path / "spool") == 0, timeout=60)  # a dead runner's spool replayed too
        _manage(env, "usage_sweep", "--min-age", "0")  # what was in flight at the kill, billed from the worker

        ledger = _query(postgres.url, "SELECT count(*) FROM billing_usagerecord WHERE batch_id = %s", batch.id)[0][0]
        assert ledger == LINES, f"{ledger} ledger rows for {LINES} lines"
        # The gateway may answer a 503 for its first query on a connection the restart dropped: retried.
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=3, timeout=30)
        finished = client.batches.retrieve(batch.id)
        assert (finished.request_counts.completed, finished.request_counts.failed) == (LINES, 0)
        output = [json.loads(x) for x in client.files.content(finished.output_file_id).read().splitlines()]
        assert sorted(o["custom_id"] for o in output) == sorted(f"line-{i}" for i in range(LINES))  # each once
        assert all(o["response"]["status_code"] == 200 for o in output)
        from controlplane.batches.lines import line_ledger_key

        keys = {key for (key,) in _query(postgres.url, "SELECT batch_line FROM billing_usagerecord "
                                                       "WHERE batch_id = %s AND completion_tokens > 0", batch.id)}
        assert keys == {line_ledger_key(batch_id=batch.id, custom_id=f"line-{i}") for i in range(LINES)}
        assert _query(postgres.url, "SELECT count(*) FROM gateway_inflightrequest")[0][0] == 0
        if not kill:  # nothing was sent twice: each output line names the request its ledger row bills
            billed = {rid for (rid,) in _query(postgres.url, "SELECT request_id FROM billing_usagerecord "
                                                             "WHERE batch_id = %s", batch.id)}
            assert {o["response"]["request_id"] for o in output} == billed
        print(f"\nbatch of {LINES} completed after a {OUTAGE:.0f} s outage{' and a kill' if kill else ''}; "
              f"{len(workers[0].received) + len(workers[1].received)} requests reached the workers")
    finally:
        for runner in runners:
            runner.stop(signal.SIGKILL)
        gateway.kill()
        gateway.wait(10)
