"""fsbroker.py: make run's file-system broker hands a consumer a whole message or none, and each message
to one consumer only. kombu's own transport created the file and then wrote it, and a consumer between
the two took an empty message and its Celery worker exited (`JSONDecodeError`; make run's stack did not
come up); the same pause in kombu's own `_put` (after its file exists, before its bytes) fails there."""

from __future__ import annotations

import os
import threading
from queue import Empty

import pytest
from kombu import Connection

import fsbroker


@pytest.fixture
def folders(tmp_path):
    for sub in ("queue", "processed", "control"):
        (tmp_path / sub).mkdir()
    return {"data_folder_in": str(tmp_path / "queue"), "data_folder_out": str(tmp_path / "queue"),
            "processed_folder": str(tmp_path / "processed"), "control_folder": str(tmp_path / "control")}


@pytest.fixture
def channel(folders):
    def make():
        conn = Connection("filesystem://", transport=fsbroker.TRANSPORT, transport_options=folders)
        opened.append(conn)
        return conn.default_channel

    opened: list[Connection] = []
    yield make
    for conn in opened:
        conn.release()


def test_the_broker_url_and_transport_resolve_to_this_transport(channel):
    assert isinstance(channel(), fsbroker.Channel)


def test_a_message_being_written_is_not_seen_until_it_is_whole(channel, monkeypatch):
    publisher, consumer = channel(), channel()
    written, release = threading.Event(), threading.Event()
    replace = os.replace

    def paused_replace(src, dst):
        written.set()  # its bytes are on disk under the part name
        assert release.wait(10)
        replace(src, dst)

    monkeypatch.setattr(fsbroker.os, "replace", paused_replace)
    body = {"task": "x", "args": ["y" * 100_000]}
    putting = threading.Thread(target=publisher._put, args=("q", body))
    putting.start()
    assert written.wait(10)
    with pytest.raises(Empty):
        consumer._get("q")  # the file is there, not yet under a name a consumer takes
    release.set()
    putting.join(10)
    assert consumer._get("q") == body
    with pytest.raises(Empty):
        consumer._get("q")
    assert not [n for n in os.listdir(publisher.data_folder_in) if not n.startswith(".")]


def test_messages_come_only_for_their_queue(channel):
    ch = channel()
    for i in range(5):
        ch._put("a", {"i": i})
    ch._put("b", {"i": "b"})
    assert sorted(ch._get("a")["i"] for _ in range(5)) == [0, 1, 2, 3, 4]  # time-ordered to the millisecond
    with pytest.raises(Empty):
        ch._get("a")
    assert ch._get("b") == {"i": "b"}


def test_racing_publishers_and_consumers_deliver_every_message_whole_and_once(channel):
    """Two publishers and two consumers on one folder, large messages (long writes): every message
    arrives whole, exactly once, and nothing is left behind."""
    n, per = 2, 150
    got: list[list[dict]] = [[], []]
    errors: list[BaseException] = []
    done = threading.Event()

    def publish(k: int) -> None:
        ch = channel()
        for i in range(per):
            ch._put("q", {"k": k, "i": i, "pad": "z" * 50_000})

    def consume(slot: list[dict]) -> None:
        ch = channel()
        try:
            while True:
                try:
                    slot.append(ch._get("q"))
                except Empty:
                    if done.is_set():
                        return
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    consumers = [threading.Thread(target=consume, args=(got[j],)) for j in range(2)]
    publishers = [threading.Thread(target=publish, args=(k,)) for k in range(n)]
    for t in consumers + publishers:
        t.start()
    for t in publishers:
        t.join(60)
    done.set()
    for t in consumers:
        t.join(60)
    assert not errors, errors[:1]
    received = [(m["k"], m["i"]) for slot in got for m in slot]
    assert sorted(received) == [(k, i) for k in range(n) for i in range(per)]  # each once
    assert all(len(m["pad"]) == 50_000 for slot in got for m in slot)
    folder = channel().data_folder_in
    assert os.listdir(folder) == []
    assert os.listdir(channel().processed_folder) == []


def test_both_planes_use_it_for_a_file_system_broker_and_only_then():
    """Each plane's Celery app installs it for `filesystem://` URLs; a URL of another scheme that the same
    app connects to keeps its own transport (a `broker_transport` setting took over those too)."""
    from controlplane.celery import app as control_plane
    from dataplane.worker.agent.tasks import app as agent

    for app in (control_plane, agent):
        with app.connection_for_write(url="filesystem://") as conn:
            assert isinstance(conn.transport, fsbroker.Transport)
        with app.connection_for_read(url="redis://127.0.0.1:1/0") as conn:
            assert not isinstance(conn.transport, fsbroker.Transport)
            assert conn.transport.driver_type == "redis"
