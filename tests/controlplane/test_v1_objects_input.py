"""The Files, Batches and Responses endpoints refuse bad input with a 4xx in OpenAI's error body, never
a 500: page sizes that only look like numbers, broken multipart uploads, and NUL characters in ids and
stored fields (PostgreSQL refuses \\u0000 in text and jsonb; SQLite takes it, so these run on both)."""

from __future__ import annotations

import json

import pytest

from .asgi_driver import Reply, call

pytestmark = pytest.mark.django_db(transaction=True)

NUL = "\x00"


@pytest.fixture
def secret(gateway, tenant_key, settings, tmp_path):
    settings.TESSERA_FILES_DIR = str(tmp_path / "files")
    _, secret = tenant_key.sync(requests_per_minute=10**6)
    return secret


async def send(secret: str, path: str, body: bytes = b"", *, method: str = "POST", content_type: str | None = None) -> Reply:
    from controlplane.asgi import application

    headers = {"Authorization": f"Bearer {secret}"}
    if content_type is not None:
        headers["content-type"] = content_type
    return await call(application, path, [body] if body else [], method=method, headers=headers)


def assert_openai_error(reply: Reply, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert reply.status == status, (reply.status, reply.body[:400])
    error = json.loads(reply.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def multipart(parts: list[tuple[str, str | None, bytes]], boundary: str = "XyZbound") -> bytes:
    """A multipart/form-data body from (field, filename or None, content)."""
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


LINE = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}}).encode()


async def upload(secret: str, filename: str = "in.jsonl") -> str:
    body = multipart([("purpose", None, b"batch"), ("file", filename, LINE + b"\n")])
    reply = await send(secret, "/v1/files", body, content_type="multipart/form-data; boundary=XyZbound")
    assert reply.status == 200, reply.body
    return reply.json()["id"]


@pytest.mark.parametrize("path", ["/v1/files", "/v1/batches", "/v1/responses/resp_x/input_items"])
@pytest.mark.parametrize("limit", ["%C2%B2", "%D9%A3", "1_0", "+5", "%205", "0", "-1", "99999999999999999999999"])
async def test_a_limit_that_is_not_plain_digits_is_a_400(secret, path, limit):
    """'²'.isdigit() is true and int('²') raises: that was a 500. Arabic-Indic '٣' int() parses; not a limit either."""
    assert_openai_error(await send(secret, f"{path}?limit={limit}", method="GET"), 400, "limit", "invalid_value")


async def test_a_plain_limit_still_pages(secret):
    first, second = await upload(secret), await upload(secret)
    reply = await send(secret, "/v1/files?limit=1", method="GET")
    assert reply.status == 200 and [f["id"] for f in reply.json()["data"]] == [second] and reply.json()["has_more"]
    assert first != second


@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=\x01"])
async def test_a_multipart_upload_without_a_usable_boundary_is_a_400(secret, content_type):
    body = multipart([("purpose", None, b"batch"), ("file", "in.jsonl", LINE)])
    assert_openai_error(await send(secret, "/v1/files", body, content_type=content_type), 400)


async def test_more_than_100_file_parts_is_a_400(secret):
    parts = [("purpose", None, b"batch")] + [("file", f"{i}.jsonl", LINE) for i in range(101)]
    body = multipart(parts)
    assert_openai_error(await send(secret, "/v1/files", body, content_type="multipart/form-data; boundary=XyZbound"), 400)


async def test_too_many_form_fields_is_a_400(secret):
    body = multipart([("purpose", None, b"batch")] + [(f"f{i}", None, b"x") for i in range(1001)])
    assert_openai_error(await send(secret, "/v1/files", body, content_type="multipart/form-data; boundary=XyZbound"), 400)


# An id holding NUL names nothing: the same 404 as any unknown id, on PostgreSQL as on SQLite.
NUL_IDS = [
    ("GET", "/v1/files/file-{nul}", "file_not_found"),
    ("DELETE", "/v1/files/file-{nul}", "file_not_found"),
    ("GET", "/v1/files/file-{nul}/content", "file_not_found"),
    ("GET", "/v1/batches/batch_{nul}", "batch_not_found"),
    ("POST", "/v1/batches/batch_{nul}/cancel", "batch_not_found"),
    ("GET", "/v1/responses/resp_{nul}", "not_found"),
    ("DELETE", "/v1/responses/resp_{nul}", "not_found"),
    ("GET", "/v1/responses/resp_{nul}/input_items", "not_found"),
]


@pytest.mark.parametrize(("method", "path", "code"), NUL_IDS)
async def test_an_id_holding_nul_is_a_404(secret, method, path, code):
    assert_openai_error(await send(secret, path.format(nul=NUL), method=method), 404, code=code)


@pytest.mark.parametrize("path", ["/v1/files?after=file-%00", "/v1/batches?after=batch_%00"])
async def test_an_after_cursor_holding_nul_is_a_404(secret, path):
    assert_openai_error(await send(secret, path, method="GET"), 404)


async def test_a_purpose_filter_holding_nul_is_a_400(secret):
    assert_openai_error(await send(secret, "/v1/files?purpose=batch%00", method="GET"), 400, "purpose", "invalid_value")


async def test_an_upload_whose_fields_hold_nul_is_a_400(secret):
    for parts, param in [
        ([("purpose", None, b"batch\x00"), ("file", "in.jsonl", LINE)], "purpose"),
        ([("purpose", None, b"batch"), ("file", "in\x00.jsonl", LINE)], "file"),
    ]:
        body = multipart(parts)
        reply = await send(secret, "/v1/files", body, content_type="multipart/form-data; boundary=XyZbound")
        assert reply.status in (400, 200), reply.body  # a filename may come back cleaned; never a 500
        if reply.status == 400:
            assert_openai_error(reply, 400, param)
        else:
            assert NUL not in reply.json()["filename"]


def batch_body(**fields) -> bytes:
    return json.dumps({"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h",
                       **fields}).encode()


async def test_a_batch_naming_an_input_file_id_holding_nul_is_a_404(secret):
    assert_openai_error(await send(secret, "/v1/batches", batch_body(input_file_id=f"file-{NUL}")), 404,
                        "input_file_id", "file_not_found")


@pytest.mark.parametrize("metadata", [{"k": f"v{NUL}"}, {f"k{NUL}": "v"}])
async def test_batch_metadata_holding_nul_is_a_400(secret, metadata):
    file_id = await upload(secret)
    assert_openai_error(await send(secret, "/v1/batches", batch_body(input_file_id=file_id, metadata=metadata)), 400,
                        "metadata", "invalid_value")


async def test_a_previous_response_id_holding_nul_is_a_404(secret):
    body = json.dumps({"model": "fake-model", "input": "hi", "previous_response_id": f"resp_{NUL}"}).encode()
    assert_openai_error(await send(secret, "/v1/responses", body), 404, "previous_response_id", "not_found")
