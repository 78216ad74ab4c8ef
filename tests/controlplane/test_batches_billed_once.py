"""A batch line is billed at most once whatever fails after it was served, and no retry loops.

Each test is a path on which the runner used to send an already billed line again under a new request
id (billed again each time): an answer PostgreSQL refused (a NUL in the text, in a `jsonb` column), an
answer the database refuses for any other reason, PostgreSQL away for a moment when the answer is
stored; and a line whose runner keeps dying under it, re-sent with no cap. The expiry set on the
batch bounds the loop the code before the fix ran into, so that it fails instead of hanging.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
import time

import openai
import pytest
from django.db import connection
from django.utils import timezone

from .test_batches_api import _jsonl, _line, _run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client_for(live_gateway, tenant_key, settings, tmp_path):
    settings.TESSERA_FILES_DIR = str(tmp_path / "files")

    def make(**tier_fields):
        tier_fields.setdefault("requests_per_minute", 10_000)
        tenant, secret = tenant_key.sync(**tier_fields)
        return tenant, openai.OpenAI(base_url=f"{live_gateway}/v1", api_key=secret, max_retries=0, timeout=30)

    return make


@pytest.fixture
def ledger(gateway):
    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"  # the real ledger


def _batch(client, lines: list[dict], *, expires_in: float = 10.0):
    from controlplane.batches.models import Batch

    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    Batch.objects.filter(pk=batch.id).update(expires_at=timezone.now() + dt.timedelta(seconds=expires_in))
    return batch


def _sent(workers) -> list:
    return [r for w in workers for r in w.received if r.path.endswith("/chat/completions")]


def _file(client, file_id: str) -> list[dict]:
    return [json.loads(x) for x in client.files.content(file_id).read().splitlines()]


def test_an_answer_holding_a_nul_is_stored_whole_and_billed_once(client_for, workers, ledger):
    """A model can answer a NUL (a completions line with `echo: true` and a prompt token that decodes to
    byte 0, a `logit_bias` forcing it); PostgreSQL's jsonb refused it, and the line was sent, and
    billed, again every 2 s for its whole window. Now it is stored as sent, on both databases."""
    from billing.models import UsageRecord

    for worker in workers:
        worker.answer_text = "before\x00after \\u0000 \x01"
    _, client = client_for()
    batch = _batch(client, [_line("nul"), _line("plain")])
    status = _run(batch.id)
    assert len(_sent(workers)) == 2  # each line sent once
    assert UsageRecord.objects.filter(batch_id=batch.id).count() == 2  # one ledger row per line
    assert status == "completed"
    output = {o["custom_id"]: o for o in _file(client, client.batches.retrieve(batch.id).output_file_id)}
    assert output["nul"]["response"]["body"]["choices"][0]["message"]["content"] == "before\x00after \\u0000 \x01"


@pytest.fixture
def refusing_database(db):
    """A PostgreSQL trigger that refuses to store any batch line answer holding `refuse-me` (as the
    database refuses what it cannot hold: the real refusal, not a stand-in for it)."""
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL trigger")
    with connection.cursor() as cursor:
        cursor.execute("""
            CREATE FUNCTION test_refuse_answer() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.response::text LIKE '%refuse-me%' THEN
                    RAISE EXCEPTION 'this answer cannot be stored' USING ERRCODE = '22023';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_refuse_answer BEFORE UPDATE ON batches_batchline
                FOR EACH ROW EXECUTE FUNCTION test_refuse_answer();""")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS test_refuse_answer ON batches_batchline; "
                       "DROP FUNCTION IF EXISTS test_refuse_answer();")


def test_an_answer_the_database_refuses_fails_its_line_once_with_an_error_line(
        client_for, workers, ledger, refusing_database):
    from billing.models import UsageRecord

    for worker in workers:
        worker.answer_text = "please refuse-me"
    _, client = client_for()
    batch = _batch(client, [_line("refused")])
    status = _run(batch.id)
    assert len(_sent(workers)) == 1
    (record,) = UsageRecord.objects.filter(batch_id=batch.id)  # served once, billed once
    assert status == "completed"
    done = client.batches.retrieve(batch.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 1)
    (error,) = _file(client, done.error_file_id)
    assert error["custom_id"] == "refused" and error["error"]["code"] == "answer_unstorable"
    assert error["response"]["status_code"] == 500 and error["response"]["request_id"] == record.request_id


@pytest.mark.postgres
def test_postgres_away_when_the_answer_is_stored_is_waited_out(client_for, workers, ledger, database_switch):
    """PostgreSQL stops answering between the worker's answer and the line's write: the runner waits
    for it (the usage goes to the spool meanwhile) and stores the answer once it is back; the line is
    not sent again and the ledger has one row for it."""
    from billing.models import UsageRecord
    from controlplane.batches.models import BatchLine

    hold = threading.Event()
    for worker in workers:
        worker.hold = hold
    _, client = client_for()
    batch = _batch(client, [_line("blink")], expires_in=60)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["status"] = _run(batch.id)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 20
    while not _sent(workers):
        assert time.monotonic() < deadline, "the line was never sent"
        time.sleep(0.05)
    database_switch.away()
    hold.set()  # the worker answers while the database is away
    time.sleep(3)
    database_switch.back()
    runner.join(60)
    assert not runner.is_alive() and "error" not in outcome, outcome.get("error")
    assert outcome["status"] == "completed" and len(_sent(workers)) == 1
    line = BatchLine.objects.get(batch_id=batch.id)
    assert (line.state, line.attempts) == ("succeeded", 1)
    deadline = time.monotonic() + 20  # the spooled usage reaches the ledger once the writer replays it
    while not UsageRecord.objects.filter(batch_id=batch.id).exists():
        assert time.monotonic() < deadline, "the served line never reached the ledger"
        time.sleep(0.2)
    assert list(UsageRecord.objects.filter(batch_id=batch.id).values_list("request_id", flat=True)) == [
        line.request_id]


def test_a_line_whose_runner_keeps_dying_under_it_fails_after_its_tries(client_for, workers, settings):
    """A runner that dies while a line is out leaves it `running`; the next one sends it again. A line
    that takes its runner down every time (out of memory on its answer, say) must not do so forever."""
    from controlplane.batches.models import Batch, BatchLine
    from controlplane.batches.services import batch_validate

    settings.TESSERA_BATCH_LINE_ATTEMPTS = 3
    _, client = client_for()
    batch = _batch(client, [_line("poison", "poison"), _line("fine", "fine")], expires_in=3600)
    batch_validate(batch_id=batch.id)
    # What the third runner to die under it leaves: the line out, on its third try, the lease passed.
    BatchLine.objects.filter(batch_id=batch.id, custom_id="poison").update(
        state="running", attempts=3, request_id="req_b_third_dead_runner")
    Batch.objects.filter(pk=batch.id).update(lease_until=None)
    assert _run(batch.id) == "completed"
    poison = BatchLine.objects.get(batch_id=batch.id, custom_id="poison")
    assert (poison.state, poison.attempts) == ("failed", 3)
    assert [r.body["messages"][0]["content"] for r in _sent(workers)] == ["fine"]  # the poison is not sent
    errors = _file(client, client.batches.retrieve(batch.id).error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("poison", "attempts_exhausted")]
