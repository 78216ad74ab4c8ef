"""The lockout where it is served: through the deployed ASGI application (as `make run` and uvicorn
serve the admin, CSRF included), and under concurrent guessing (no lost count, no 500)."""

from __future__ import annotations

import re
import threading
from urllib.parse import urlencode

import pytest
from axes.models import AccessAttempt
from django.db import connection
from django.test import Client

from .asgi_driver import Reply, call

pytestmark = pytest.mark.django_db(transaction=True)


async def _form(app, path: str, fields: dict, cookie: str):
    """POST a urlencoded form (asgi_driver.call always declares JSON)."""
    import asyncio

    body = urlencode(fields).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/x-www-form-urlencoded"),
                         (b"content-length", str(len(body)).encode()), (b"cookie", cookie.encode())],
             "client": ("198.51.100.9", 50000), "server": ("testserver", 80)}
    messages, sent, never = [], [], asyncio.Event()

    async def receive():
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()

    async def send(message):
        messages.append(message)

    await app(scope, receive, send)
    start = messages[0]
    return Reply(start["status"], {k.decode().lower(): v.decode() for k, v in start.get("headers", [])},
                 b"".join(m.get("body", b"") for m in messages[1:]), 1)


async def test_lockout_through_the_asgi_application(django_user_model):
    from asgiref.sync import sync_to_async

    from controlplane.asgi import application

    await sync_to_async(django_user_model.objects.create_superuser)("admin", "a@example.com", "right-password")
    page = await call(application, "/admin/login/", [], method="GET")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.body.decode()).group(1)
    cookie = page.headers["set-cookie"].split(";", 1)[0]
    statuses = []
    for i in range(7):
        reply = await _form(application, "/admin/login/", {"csrfmiddlewaretoken": token, "username": "admin",
                                                           "password": f"wrong-{i}", "next": "/admin/"}, cookie)
        statuses.append(reply.status)
    assert statuses == [200] * 4 + [429] * 3, reply.body[:3000]
    assert "Too many failed sign-ins" in reply.body.decode() and int(reply.headers["retry-after"]) > 0
    assert reply.headers["x-frame-options"] == "DENY" and "content-security-policy" in reply.headers
    reply = await _form(application, "/admin/login/", {"csrfmiddlewaretoken": token, "username": "admin",
                                                       "password": "right-password", "next": "/admin/"}, cookie)
    assert reply.status == 429


def test_concurrent_guesses_are_all_counted_and_none_gets_in(django_user_model):
    """Twenty guesses at once: each is counted (row lock + F() increment), none signs in, none is a 500.
    Guesses that passed the lockout check before the limit was recorded are still counted, so a burst
    buys at most its own width in guesses and then the longest cool-down (docs/controlplane.md)."""
    django_user_model.objects.create_superuser("admin", "a@example.com", "right-password")
    statuses, barrier = [], threading.Barrier(20)

    def guess(i: int) -> None:
        client = Client()
        barrier.wait()
        response = client.post("/admin/login/?next=/admin/", {"username": "admin", "password": f"wrong-{i}"},
                               REMOTE_ADDR="198.51.100.200")
        statuses.append(response.status_code)
        connection.close()  # this thread's own connection, or the test database cannot be dropped

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(statuses) == 20 and set(statuses) <= {200, 429}, statuses
    # Each recorded failure is a distinct count 1, 2, 3...: only the first four can be under the limit,
    # so more than four plain "wrong password" answers would mean increments were lost.
    assert statuses.count(200) <= 4, statuses
    rows = AccessAttempt.objects.filter(username="admin")
    assert rows.count() == 1  # concurrent first failures made one row, not an IntegrityError
    assert 5 <= rows.get().failures_since_start <= 20
    response = Client().post("/admin/login/?next=/admin/", {"username": "admin", "password": "right-password"},
                             REMOTE_ADDR="198.51.100.201")
    assert response.status_code == 429

