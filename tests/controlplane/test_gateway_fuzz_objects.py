"""The gateway fuzz (test_gateway_fuzz.py) on the endpoints that keep objects: Files, Batches and
Responses. Their ids, cursors, filters, page sizes, form fields and bodies reach the database, which is
where PostgreSQL and SQLite differ (PostgreSQL refuses \\u0000 in text and jsonb), so this module runs
on both: in this process on the test database, and once more in a child pytest on the other one.

Never a 5xx, and every 4xx is OpenAI's error body. Seeded (derandomize); FUZZ_EXAMPLES searches longer."""

from __future__ import annotations

import json
import os
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .asgi_driver import Reply, call
from .other_database import run_on_other_database
from .test_gateway_fuzz import assert_not_a_failure, json_values

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "80"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CHILD = "TESSERA_FUZZ_OTHER_DATABASE"  # set in the child run: it must not start another

# Strings a client gets wrong, drawn often so that short runs meet them.
ODD = ["", "\x00", "a\x00b", "²", "٣", "1_0", "+5", " 5", "-1", "0", "1", "10001", "9" * 30, "file-\x00",
       "batch_\x00", "resp_\x00", "x" * 200, "..", "%00", "é", "\u202e", "\ufeff"]
texts = st.one_of(st.text(max_size=24), st.sampled_from(ODD))
with_nul = st.tuples(st.sampled_from(["", "file-", "batch_", "resp_"]), st.text(max_size=8)).map(lambda p: f"{p[0]}\x00{p[1]}")
# Stand-ins for the real objects' ids, swapped in per test (the strategies are built before they exist).
REAL = ("<file>", "<batch>", "<response>")
ids = st.one_of(texts, with_nul, st.sampled_from(REAL), st.sampled_from(REAL))


@pytest.fixture
def secret(gateway, tenant_key, settings, tmp_path, monkeypatch):
    from controlplane.batches import tasks

    settings.TESSERA_FILES_DIR = str(tmp_path / "files")
    monkeypatch.setattr(tasks, "enqueue_run", lambda batch_id: None)  # batches are created, never run here
    _, secret = tenant_key.sync(requests_per_minute=10**6, tokens_per_minute=10**9, max_concurrent_requests=1000)
    return secret


async def send(secret: str, method: str, path: str, body: bytes = b"", *, query: str = "",
               content_type: str | None = None) -> Reply:
    from controlplane.asgi import application

    headers = {"Authorization": f"Bearer {secret}"}
    if content_type is not None:
        headers["content-type"] = content_type
    return await call(application, path, [body] if body else [], method=method, headers=headers, query=query)


def multipart(parts: list[tuple[str, str | None, bytes]], boundary: str) -> bytes:
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


LINE = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}


@pytest.fixture
async def real(secret) -> dict[str, str]:
    """One file, one batch and one stored response of the tenant, so that ids and cursors also name
    objects that exist."""
    body = multipart([("purpose", None, b"batch"), ("file", "in.jsonl", json.dumps(LINE).encode())], "b0undary")
    file_id = (await send(secret, "POST", "/v1/files", body, content_type="multipart/form-data; boundary=b0undary")).json()["id"]
    batch = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch_id = (await send(secret, "POST", "/v1/batches", json.dumps(batch).encode())).json()["id"]
    response = {"model": "fake-model", "input": "hi", "max_output_tokens": 2}
    response_id = (await send(secret, "POST", "/v1/responses", json.dumps(response).encode())).json()["id"]
    return {"<file>": file_id, "<batch>": batch_id, "<response>": response_id}


def swap(value, real: dict[str, str]):
    """`value` with the stand-ins replaced by the real ids, wherever they are in it."""
    if isinstance(value, str):
        return real.get(value, value)
    if isinstance(value, list):
        return [swap(v, real) for v in value]
    if isinstance(value, dict):
        return {swap(k, real): swap(v, real) for k, v in value.items()}
    return value


READS = [("GET", "/v1/files"), ("GET", "/v1/files/{id}"), ("DELETE", "/v1/files/{id}"),
         ("GET", "/v1/files/{id}/content"), ("GET", "/v1/batches"), ("GET", "/v1/batches/{id}"),
         ("POST", "/v1/batches/{id}/cancel"), ("GET", "/v1/responses/{id}"), ("DELETE", "/v1/responses/{id}"),
         ("GET", "/v1/responses/{id}/input_items")]
queries = st.dictionaries(st.sampled_from(["limit", "after", "order", "purpose", "stream"]), ids, max_size=3)


@FUZZ
@given(route=st.sampled_from(READS), object_id=ids, query=queries)
async def test_reads_with_any_id_and_query(secret, real, route, object_id, query):
    method, template = route
    path = template.format(id=swap(object_id, real))
    encoded = "&".join(f"{quote(k)}={quote(swap(v, real), safe='')}" for k, v in query.items())
    assert_not_a_failure(await send(secret, method, path, query=encoded), (method, path, encoded))


boundaries = st.sampled_from(["b0undary", "", "a b", "\x01", "-" * 71, "x" * 80])
content_types = st.sampled_from(["multipart/form-data; boundary={b}", "multipart/form-data", "multipart/form-data; boundary=",
                                 "multipart/mixed; boundary={b}", "application/json", "text/plain",
                                 "application/x-www-form-urlencoded"])
file_contents = st.one_of(
    st.binary(max_size=80),
    st.lists(json_values, min_size=1, max_size=3).map(lambda rows: b"\n".join(json.dumps(r).encode() for r in rows)),
    st.just(json.dumps(LINE).encode()),
    st.just(json.dumps({**LINE, "custom_id": "a\x00"}).encode()),
)
form_parts = st.lists(st.tuples(st.sampled_from(["file", "purpose", "other"]), st.none() | texts,
                                texts.map(str.encode) | file_contents), max_size=4)


@FUZZ
@given(purpose=texts | st.just("batch"), filename=st.none() | texts, content=file_contents, extra=form_parts,
       boundary=boundaries, content_type=content_types, many_files=st.sampled_from([0, 0, 0, 101]))
async def test_file_uploads(secret, purpose, filename, content, extra, boundary, content_type, many_files):
    parts = [("purpose", None, purpose.encode()), ("file", filename, content), *extra]
    parts += [("file", f"{i}.jsonl", content) for i in range(many_files)]
    body = multipart(parts, boundary or "b0undary")
    reply = await send(secret, "POST", "/v1/files", body, content_type=content_type.format(b=boundary))
    assert_not_a_failure(reply, (purpose, filename, content[:100], extra, boundary, content_type, many_files))


def _replace(body: dict, path: tuple, value) -> dict:
    body = json.loads(json.dumps(body))
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


def one_bad_field(valid: dict, paths: list) -> st.SearchStrategy:
    return st.builds(lambda path, value: _replace(valid, path, value), st.sampled_from(paths),
                     st.one_of(json_values, ids, ids))


VALID_BATCH = {"input_file_id": "<file>", "endpoint": "/v1/chat/completions", "completion_window": "24h",
               "metadata": {"team": "a"}}
BATCH_PATHS = [("input_file_id",), ("endpoint",), ("completion_window",), ("metadata",), ("metadata", "team")]


@FUZZ
@given(body=one_bad_field(VALID_BATCH, BATCH_PATHS) | json_values)
async def test_batch_creation(secret, real, body):
    body = swap(body, real)
    assert_not_a_failure(await send(secret, "POST", "/v1/batches", json.dumps(body).encode()), body)


VALID_RESPONSE = {
    "model": "fake-model", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    "instructions": "be brief", "max_output_tokens": 2, "store": True, "stream": False, "metadata": {"k": "v"},
    "previous_response_id": "<response>", "temperature": 0.5, "text": {"format": {"type": "text"}},
}
RESPONSE_PATHS = [("model",), ("input",), ("input", 0), ("input", 0, "role"), ("input", 0, "content"),
                  ("input", 0, "content", 0, "text"), ("instructions",), ("max_output_tokens",), ("store",),
                  ("stream",), ("metadata",), ("metadata", "k"), ("previous_response_id",), ("temperature",),
                  ("text",), ("tools",), ("tool_choice",)]


@FUZZ
@given(body=one_bad_field(VALID_RESPONSE, RESPONSE_PATHS))
async def test_response_creation(secret, real, body):
    body = swap(body, real)
    assert_not_a_failure(await send(secret, "POST", "/v1/responses", json.dumps(body).encode()), body)


@pytest.mark.skipif(bool(os.environ.get(CHILD)), reason="the child run is the other database already")
@pytest.mark.django_db(transaction=False)
def test_the_same_fuzz_on_the_other_database(settings):
    """This module again in a child pytest on the other backend: SQLite when this run has PostgreSQL
    (CI), PostgreSQL when this run has SQLite and a server answers."""
    run_on_other_database(settings, __file__, selection="not the_same_fuzz_on_the_other_database", child_flag=CHILD)
