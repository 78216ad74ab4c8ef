"""The usage spool: what the usage path writes while the database does not answer, replayed in order and
idempotently once it does (controlplane/gateway/usage/spool.py, usage_writer.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import fcntl
import os
import uuid

import pytest
from asgiref.sync import sync_to_async

from billing.events import UsageEvent
from controlplane.gateway.models import InflightRequest
from controlplane.gateway.usage import journal, spool, usage_writer

from . import sink

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spool_dir(tmp_path, settings):
    settings.TESSERA_USAGE_SINK = "tests.controlplane.sink.collect"
    sink.clear()
    return tmp_path / "spool"


def admission(request_id: str, tenant_id: int = 1) -> journal.Admission:
    now = dt.datetime.now(dt.UTC)
    return journal.Admission(
        request_id=request_id, tenant_id=tenant_id, api_key_id=None, model="fake-model", adapter=None, tier="t",
        prompt_estimate=10, reserved_tokens=60, reserved_spend_nano=0, period_start=now.date().replace(day=1),
        worker_url="http://worker", created_at=now)


def event(request_id: str, tenant_id: int = 1, completion: int = 7) -> UsageEvent:
    return UsageEvent(
        request_id=request_id, tenant_id=tenant_id, api_key_id=None, model="fake-model", adapter=None, tier="t",
        prompt_tokens=5, cached_tokens=0, completion_tokens=completion, ttft_ms=1.0, latency_ms=2.0, status="ok",
        created_at=dt.datetime.now(dt.UTC), http_status=200)


def test_records_round_trip_and_a_torn_last_line_is_skipped(spool_dir):
    box = spool.Spool(spool_dir, 1 << 20)
    box.append([(spool.ADMIT, admission("req_a")), (spool.EVENT, event("req_a")),
                (spool.UNSETTLED, spool.Unsettled("req_b", 1, 0, 2)), (spool.MOVED, spool.Moved("req_b", "http://w2"))])
    with open(box.path, "ab") as handle:
        handle.write(b'{"k": "event", "v": {"request_id": "req_to')  # the process died inside a write
    kinds = [(kind, item) for kind, item, _ in spool.read_records(box.path)]
    assert [k for k, _ in kinds] == ["admit", "event", "unsettled", "moved"]
    assert isinstance(kinds[0][1], journal.Admission) and kinds[0][1].request_id == "req_a"
    assert isinstance(kinds[0][1].period_start, dt.date) and kinds[0][1].created_at.tzinfo is not None
    assert kinds[1][1].completion_tokens == 7 and kinds[1][1].created_at.tzinfo is not None
    assert kinds[3][1] == spool.Moved("req_b", "http://w2")


def test_replay_is_in_order_and_idempotent(spool_dir):
    box = spool.Spool(spool_dir, 1 << 20)
    box.append([(spool.ADMIT, admission("req_done")), (spool.ADMIT, admission("req_open")),
                (spool.MOVED, spool.Moved("req_open", "http://w2")), (spool.EVENT, event("req_done")),
                (spool.ADMIT, admission("req_owed")), (spool.UNSETTLED, spool.Unsettled("req_owed", 5, 0, 7)),
                (spool.EVENT, event("req_owed"))])
    for _ in range(2):  # a crash after the commit and before the truncate replays again
        assert spool.replay_file(box.path) == 7
        assert sorted(e.request_id for e in sink.EVENTS) == ["req_done", "req_owed"]
        assert sink.DELIVERIES["req_done"] == sink.DELIVERIES["req_owed"]  # idempotent sink: billed once
        rows = {row.request_id: row for row in InflightRequest.objects.all()}
        # finished: no row; still running: its row, at the worker it was moved to; settlement owed: kept
        assert set(rows) == {"req_open", "req_owed"}
        assert rows["req_open"].worker_url == "http://w2"
        assert rows["req_owed"].unsettled_completion_tokens == 7


def test_records_spooled_during_a_replay_are_replayed_after_it(spool_dir):
    box = spool.Spool(spool_dir, 1 << 20)
    box.append([(spool.EVENT, event(f"req_{i}")) for i in range(5)])
    assert box.replay_step(2) is False  # the file is sealed; 2 of its records are in the ledger
    assert [e.request_id for e in sink.EVENTS] == ["req_0", "req_1"]
    box.append([(spool.EVENT, event("req_late"))])  # new work while the replay goes on: a new file, behind
    paths = box.paths
    assert len(paths) == 2 and box.pending
    while not box.replay_step(2):
        pass
    assert [e.request_id for e in sink.EVENTS] == ["req_0", "req_1", "req_2", "req_3", "req_4", "req_late"]
    assert not any(path.exists() for path in paths) and box.size == 0


def test_a_record_the_ledger_refuses_is_dead_lettered_and_the_rest_replayed(spool_dir, settings):
    settings.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"  # the real ledger refuses a bad tenant
    from billing.models import UsageRecord
    from tenants import services

    tenant = services.tenant_create(name=f"Spool {uuid.uuid4().hex[:6]}", tier=services.tier_create(
        name=f"tier-{uuid.uuid4().hex[:6]}", priority=5))
    box = spool.Spool(spool_dir, 1 << 20)
    box.append([(spool.EVENT, event("req_good", tenant.pk)), (spool.EVENT, event("req_bad", tenant.pk, completion=-3))])
    spool.replay_file(box.path)
    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == ["req_good"]
    dead = (spool_dir / "dead-letter.jsonl").read_text()
    assert "req_bad" in dead and "reason" in dead


def test_a_full_spool_refuses_and_says_so(spool_dir):
    box = spool.Spool(spool_dir, 600)
    box.append([(spool.ADMIT, admission("req_1"))])
    with pytest.raises(spool.SpoolFull):
        box.append([(spool.ADMIT, admission("req_2")), (spool.ADMIT, admission("req_3"))])
    assert [item.request_id for _, item, _ in spool.read_records(box.path)] == ["req_1"]  # nothing half-written


def test_a_dead_process_file_is_replayed_and_removed_a_live_one_is_not(spool_dir):
    live = spool.Spool(spool_dir, 1 << 20)
    live.append([(spool.EVENT, event("req_live"))])
    dead = spool_dir / "usage-otherhost-1-deadbeef.spool"  # no process holds its lock
    with open(dead, "wb") as handle:
        handle.write(spool._encode(spool.EVENT, event("req_dead")))
    assert spool.replay_abandoned(spool_dir, exclude=None) == 1
    assert [e.request_id for e in sink.EVENTS] == ["req_dead"]
    assert not dead.exists() and live.path.exists()  # the live one is its owner's to replay
    state = spool.directory_state(spool_dir)
    assert state["files"] == 1 and state["bytes"] == live.size and state["oldest_seconds"] >= 0


def test_a_file_locked_by_another_open_is_left_alone(spool_dir):
    spool_dir.mkdir(parents=True)
    path = spool_dir / "usage-h-2-cafe.spool"
    path.write_bytes(spool._encode(spool.EVENT, event("req_held")))
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as its (live) owner holds it
    try:
        assert spool.replay_abandoned(spool_dir) == 0 and path.exists() and not sink.EVENTS
    finally:
        os.close(fd)


@pytest.mark.postgres
async def test_the_writer_spools_while_the_database_is_away_and_replays_when_it_is_back(spool_dir, database_switch):
    """Usage the ledger cannot take goes to the spool (journal rows included, so requests are admitted),
    and reaches the ledger, in order and once, when the database answers again."""
    away, back = database_switch.away, database_switch.back
    writer = usage_writer.UsageWriter(sink.collect)
    writer.spool = spool.Spool(spool_dir, 1 << 20)
    away()
    await writer.admit(admission("req_1"))  # admitted: durable in the spool
    await writer.submit(event("req_1"))
    await writer.admit(admission("req_2"))
    assert writer.spool.pending and writer.spool.records == 3 and not sink.EVENTS
    back()
    deadline = asyncio.get_running_loop().time() + 10
    while writer.spool.pending:
        assert asyncio.get_running_loop().time() < deadline, "the spool was not replayed"
        await writer.submit(event(f"req_after_{uuid.uuid4().hex[:4]}"))  # wakes the writer; goes after the spool
        await asyncio.sleep(0.3)
    await asyncio.sleep(0.3)
    ids = [e.request_id for e in sink.EVENTS]
    assert ids[0] == "req_1" and all(i.startswith("req_after_") for i in ids[1:])  # replayed first, in order
    rows = await sync_to_async(lambda: set(InflightRequest.objects.values_list("request_id", flat=True)))()
    assert rows == {"req_2"}  # still in flight


@pytest.mark.postgres
async def test_a_full_spool_refuses_the_request_it_cannot_journal(spool_dir, database_switch, settings):
    away, back = database_switch.away, database_switch.back
    writer = usage_writer.UsageWriter(sink.collect)
    writer.spool = spool.Spool(spool_dir, 300)  # smaller than one journal row
    away()
    with pytest.raises(spool.SpoolFull):
        await writer.admit(admission("req_refused"))
    back()


def test_metrics_show_the_spool_and_the_alert_rules_name_them(client, settings, tmp_path):
    from pathlib import Path

    import yaml

    from controlplane.gateway.usage.spool_metrics import SPOOL_COLLECTOR

    settings.TESSERA_USAGE_SPOOL_DIR = tmp_path / "spool"
    box = spool.Spool(tmp_path / "spool", 1 << 20)
    box.append([(spool.EVENT, event("req_m"))])
    SPOOL_COLLECTOR.clear()
    text = client.get("/metrics").content.decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(samples["tessera_usage_spool_bytes"]) == box.size > 0
    assert samples["tessera_usage_spool_files"] == "1.0" and float(samples["tessera_usage_spool_oldest_seconds"]) >= 0
    assert "tessera_usage_spool_refused_total" in samples and "tessera_usage_spooled_records_total" in samples
    rules = yaml.safe_load(Path("deploy/prometheus/tessera-usage-rules.yml").read_text())["groups"][0]["rules"]
    exprs = " ".join(rule["expr"] for rule in rules)
    for series in ("tessera_usage_spool_oldest_seconds", "tessera_usage_spool_bytes", "tessera_usage_spool_max_bytes",
                   "tessera_usage_spool_refused_total"):
        assert series in exprs and series in text


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs: a disk that really fills (root only; skipped elsewhere)."""
    import subprocess

    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)  # lazily: a spool file may still be open


def test_a_disk_that_fills_refuses_and_keeps_what_was_written(tiny_disk, spool_dir):
    filler = tiny_disk / "filler"
    filler.write_bytes(b"\0" * 16 * 1024)
    box = spool.Spool(tiny_disk / "spool", 1 << 30)  # the cap is not what stops it: the disk is
    written = 0
    with pytest.raises(spool.SpoolFull):
        for i in range(10_000):
            box.append([(spool.EVENT, event(f"req_{i}")), (spool.ADMIT, admission(f"req_x{i}"))])
            written += 1
    assert 5 < written < 10_000
    filler.unlink()  # room again: the next append must start on a line of its own
    box.append([(spool.EVENT, event("req_after"))])
    kept = [item.request_id for kind, item, _ in spool.read_records(box.path) if kind == spool.EVENT]
    assert kept == [f"req_{i}" for i in range(written)] + ["req_after"]  # every acknowledged record, in order
    assert spool.replay_file(box.path) == 2 * written + 1 and [e.request_id for e in sink.EVENTS] == kept
