"""A request waits for its journal row, not for the ledger writes batched with it: the usage writer
commits a batch's journal rows in a transaction of their own and releases their requests before it
writes the batch's usage events (controlplane/gateway/usage/usage_writer.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from controlplane.gateway.models import InflightRequest
from controlplane.gateway.usage import spool, usage_writer

from . import sink
from .test_usage_spool import admission, event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gated(tmp_path, settings):
    """A writer whose sink holds each `req_slow*` event until the test opens its gate."""
    settings.TESSERA_USAGE_SINK = "tests.controlplane.sink.collect"
    sink.clear()
    gates: dict[str, threading.Event] = {}
    entered: dict[str, threading.Event] = {}

    def slow_sink(*, event):
        if event.request_id.startswith("req_slow"):
            entered.setdefault(event.request_id, threading.Event()).set()
            gates.setdefault(event.request_id, threading.Event()).wait(30)
        sink.collect(event=event)

    writer = usage_writer.UsageWriter(slow_sink)
    writer.spool = spool.Spool(tmp_path / "spool", 1 << 20)
    yield writer, gates, entered
    for gate in gates.values():
        gate.set()
    writer.close()  # its spooled records must not be replayed into a later test's sink


async def test_a_journal_row_is_released_before_the_ledger_writes_of_its_batch(gated):
    writer, gates, entered = gated
    for name in ("req_slow_1", "req_slow_2"):
        gates[name], entered[name] = threading.Event(), threading.Event()
    first = writer.submit(event("req_slow_1"))
    assert await asyncio.to_thread(entered["req_slow_1"].wait, 10)  # the writer is inside a ledger write
    # Queued meanwhile, so written as one batch: a finished request's event, then a new request's row.
    second = writer.submit(event("req_slow_2"))
    admitted = writer.admit(admission("req_new"))
    gates["req_slow_1"].set()
    await asyncio.wait_for(admitted, 10)  # before the slow event of its batch is written
    assert not gates["req_slow_2"].is_set() and entered["req_slow_2"].wait(10)
    committed = await sync_to_async(lambda: InflightRequest.objects.filter(request_id="req_new").exists())()
    assert committed  # durable before its request was released
    gates["req_slow_2"].set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert [e.request_id for e in sink.EVENTS] == ["req_slow_1", "req_slow_2"]


async def test_rows_and_events_of_one_batch_while_the_database_is_away_are_spooled_in_order(gated, monkeypatch):
    """The split keeps the spool's order: a row spooled first, then the events behind it, never the
    events in the ledger ahead of a spooled row."""
    writer, gates, entered = gated
    gates["req_slow_0"], entered["req_slow_0"] = threading.Event(), threading.Event()
    blocker = writer.submit(event("req_slow_0"))
    assert await asyncio.to_thread(entered["req_slow_0"].wait, 10)
    real_insert = usage_writer.journal.insert

    def away(*args, **kwargs):
        from django.db import OperationalError

        raise OperationalError("connection refused: the database is away")

    monkeypatch.setattr(usage_writer.journal, "insert", away)
    followed = writer.submit(event("req_after"))
    admitted = writer.admit(admission("req_spooled"))
    gates["req_slow_0"].set()
    await asyncio.wait_for(asyncio.gather(blocker, admitted, followed), 10)
    monkeypatch.setattr(usage_writer.journal, "insert", real_insert)
    kinds = [(kind, item.request_id) for kind, item, _ in spool.read_records(writer.spool.path)]
    assert kinds == [(spool.ADMIT, "req_spooled"), (spool.EVENT, "req_after")]
    assert [e.request_id for e in sink.EVENTS] == ["req_slow_0"]  # nothing overtook the spooled row


async def test_close_writes_what_is_queued_then_stops_the_thread(gated):
    writer, _, _ = gated
    last = writer.submit(event("req_last"))
    await asyncio.to_thread(writer.close)
    assert not writer.thread.is_alive()
    await asyncio.wait_for(last, 5)
    assert [e.request_id for e in sink.EVENTS] == ["req_last"]


async def test_a_journal_batchs_turn_ends_with_it(gated, monkeypatch):
    """A batch of journal rows writes ahead of every other writer (common/write_priority.py); the writer
    thread's later work (its spool replays, each loop's housekeeping) takes the background turn again."""
    from common import write_priority

    writer, _, _ = gated
    seen: list[int] = []
    housekeeping = writer._housekeeping

    def spying():
        seen.append(write_priority.current.get())
        housekeeping()

    monkeypatch.setattr(writer, "_housekeeping", spying)
    await asyncio.wait_for(writer.admit(admission("req_turn")), 10)
    seen.clear()
    await asyncio.wait_for(writer.submit(event("req_turn")), 10)  # the next loop, after the journal batch
    assert seen and set(seen) == {write_priority.BACKGROUND}
