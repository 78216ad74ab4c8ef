"""Security headers on the admin, the management API and the gateway's /v1 (controlplane/doors/headers.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from django.test import Client

from .asgi_driver import call, chat_body

pytestmark = pytest.mark.django_db


def _directives(policy: str) -> dict[str, list[str]]:
    parts = (part.strip().split() for part in policy.split(";") if part.strip())
    return {words[0]: words[1:] for words in parts}


def _assert_django_headers(response) -> None:
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Content-Type-Options"] == "nosniff"
    policy = _directives(response["Content-Security-Policy"])
    assert policy["script-src"] == ["'self'"]  # no inline script, no other origin
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["object-src"] == ["'none'"] and policy["base-uri"] == ["'none'"]
    # Plain HTTP keeps working outside production: no HSTS, no secure-only cookies.
    assert "Strict-Transport-Security" not in response
    for cookie in response.cookies.values():
        assert not cookie["secure"]


def test_admin_pages(django_user_model):
    _assert_django_headers(Client().get("/admin/login/"))
    django_user_model.objects.create_superuser("admin", "a@example.com", "pw")
    client = Client()
    response = client.post("/admin/login/?next=/admin/", {"username": "admin", "password": "pw"})
    _assert_django_headers(response)
    _assert_django_headers(client.get("/admin/tenants/tenant/"))


def test_management_api(make_user):
    _assert_django_headers(Client().get("/api/v1/tiers/"))  # 401
    client = Client()
    client.force_login(make_user("ops", role="operator"))
    response = client.get("/api/v1/tiers/")
    assert response.status_code == 200
    _assert_django_headers(response)


@pytest.mark.parametrize("path", ["/api/v1/docs/", "/api/v1/redoc/", "/api/v1/docs/?script="])
def test_api_docs_pages_load_only_from_this_server(path):
    """The docs ship with the server (drf-spectacular-sidecar): no CDN, no inline script; only ReDoc's
    blob: worker is added, and no other page gets even that."""
    response = Client().get(path)
    assert response.status_code == 200
    docs = _directives(response["Content-Security-Policy"])
    assert docs["script-src"] == ["'self'"] and docs["default-src"] == ["'self'"]
    assert docs["worker-src"] == ["'self'", "blob:"] and docs["frame-ancestors"] == ["'none'"]
    assert not any("https:" in v or "http:" in v for values in docs.values() for v in values), docs
    if "script" not in path:
        body = response.content.decode()
        assert "<script>" not in body and "https://" not in body, body
    schema = _directives(Client().get("/api/v1/schema/")["Content-Security-Policy"])
    assert schema["script-src"] == ["'self'"] and "worker-src" not in schema


API_HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "content-security-policy": "default-src 'none'; frame-ancestors 'none'",
}


async def test_gateway_errors_carry_the_headers():
    from controlplane.asgi import application

    reply = await call(application, "/v1/chat/completions", [chat_body(100)])
    assert reply.status == 401 and reply.json()["error"]["code"]
    for name, value in API_HEADERS.items():
        assert reply.headers[name] == value


@pytest.mark.parametrize("stream", [False, True])
async def test_gateway_answers_carry_the_headers_once(gateway, tenant_key, stream):
    from controlplane.asgi import application

    _, secret = await tenant_key()
    raw, sent = [], []
    never = asyncio.Event()

    async def receive():
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays connected; the handler cancels this when it is done

    async def send(message):
        raw.append(message)

    body = chat_body(200, stream=stream)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), (b"authorization", f"Bearer {secret}".encode())],
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}
    await application(scope, receive, send)
    start = next(m for m in raw if m["type"] == "http.response.start")
    assert start["status"] == 200, raw
    names = [name.decode().lower() for name, _ in start["headers"]]
    for name, value in API_HEADERS.items():
        assert names.count(name) == 1
        assert dict((n.decode().lower(), v.decode()) for n, v in start["headers"])[name] == value
    if stream:
        assert b"data: [DONE]" in b"".join(m.get("body", b"") for m in raw if m["type"] == "http.response.body")


def test_production_settings_force_https_and_two_factor():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.production",
           "DJANGO_SECRET_KEY": "x" * 50, "TESSERA_ADMIN_2FA_ROLES": ""}
    env.pop("TESSERA_ADMIN_2FA_ROLES")
    code = ("import json, django; from django.conf import settings as s; django.setup(); "
            "print(json.dumps([s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
            "s.TESSERA_ADMIN_2FA_ROLES, s.X_FRAME_OPTIONS]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    hsts, session_secure, csrf_secure, roles, frame = json.loads(out.stdout.strip().splitlines()[-1])
    assert hsts > 0 and session_secure and csrf_secure and frame == "DENY"
    assert sorted(roles) == ["finance", "operator"]
