"""Which turn a request's database writes take (common/write_priority.py): its reservation at its tier's
priority, its journal row ahead of everything, its settlement and ledger row last. On make run's SQLite
those are the places in the process's line for the write lock (controlplane/db/sqlite3/turns.py);
tests/controlplane/test_sqlite_writer.py shows the line keeps that order."""

from __future__ import annotations

import json

import pytest

from common import write_priority

from .asgi_driver import call

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode()


async def test_a_requests_writes_take_its_tiers_turn_and_what_follows_the_answer_waits(
        gateway, tenant_key, workers, drain, monkeypatch):
    from controlplane.asgi import application
    from controlplane.gateway.usage import journal
    from tenants.limits import database

    seen: dict[str, list[int]] = {"reserve": [], "settle": [], "journal": [], "ledger": []}

    def spy(name, fn):
        def wrapped(first, *args, **kwargs):
            if name in ("journal", "ledger"):  # rows or ids; a batch may have none of one kind
                first = list(first)
                if not first:
                    return fn(first, *args, **kwargs)
            seen[name].append(write_priority.current.get())
            return fn(first, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(database, "_reserve", spy("reserve", database._reserve))
    monkeypatch.setattr(database, "_settle", spy("settle", database._settle))
    monkeypatch.setattr(journal, "insert", spy("journal", journal.insert))
    monkeypatch.setattr(journal, "forget", spy("ledger", journal.forget))
    _, premium = await tenant_key(priority=10)
    _, free = await tenant_key(priority=30)
    for secret in (premium, free):
        response = await call(application, "/v1/chat/completions", [CHAT], headers={"authorization": f"Bearer {secret}"})
        assert response.status == 200
        await drain()
    # each tenant's reservation at its tier's priority (asked twice: the first finds no month counter)
    assert list(dict.fromkeys(seen["reserve"])) == [10, 30] and len(seen["reserve"]) == 4
    assert seen["journal"] == [write_priority.REQUEST_PATH] * 2  # a request waits on its journal row
    assert seen["settle"] == [write_priority.BACKGROUND] * 2  # after the answer: nobody waits
    assert seen["ledger"] == [write_priority.BACKGROUND] * 2
    assert write_priority.current.get() == write_priority.BACKGROUND  # nothing leaked into the caller


async def test_a_batch_lines_writes_wait_behind_online_requests(gateway, tenant_key, workers, drain, monkeypatch):
    """A batch line goes through the same path (proxy.handle) under its batch's key, but nobody waits on
    it online: its reservation takes the background turn, as its engine steps do."""
    from django.http import HttpRequest

    from controlplane.gateway import proxy
    from tenants.limits import database

    seen: list[int] = []
    reserve = database._reserve

    def spy(*args):
        seen.append(write_priority.current.get())
        return reserve(*args)

    monkeypatch.setattr(database, "_reserve", spy)
    _, secret = await tenant_key(priority=10)
    principal = await proxy.principal_for(f"Bearer {secret}")
    response = await proxy.handle(HttpRequest(), "chat", body=CHAT, principal=principal, request_id="req_batch_line_1",
                                  batch_id="batch_test", batch_line="batch_test:line-1")
    assert response.status_code == 200
    await drain()
    assert seen and set(seen) == {write_priority.BACKGROUND}
