"""Static files from STATIC_ROOT through the async middleware stack (controlplane/static_files.py)."""

import warnings

import pytest
from django.test import AsyncClient

BODY = b"body { color: #123456; }\n" * 20_000  # 500 KB: more than one read


@pytest.fixture
def static_root(settings, tmp_path):
    (tmp_path / "admin" / "css").mkdir(parents=True)
    (tmp_path / "admin" / "css" / "site.css").write_bytes(BODY)
    settings.STATIC_ROOT = tmp_path
    return tmp_path


async def _body(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


async def test_served_whole_in_async_mode_without_a_sync_iterator(static_root):
    client = AsyncClient()  # its handler builds the middleware now, reading STATIC_ROOT
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Django warns when it must iterate a sync body
        response = await client.get("/static/admin/css/site.css")
        assert response.status_code == 200 and response["Content-Type"].startswith("text/css")
        assert response.is_async and await _body(response) == BODY
        again = await client.get("/static/admin/css/site.css", headers={"If-None-Match": response["ETag"]})
        assert again.status_code == 304  # (the test client itself empties a 304's body)
        head = await client.head("/static/admin/css/site.css")
        assert head.status_code == 200 and int(head["Content-Length"]) == len(BODY)
        part = await client.get("/static/admin/css/site.css", headers={"Range": "bytes=5-14"})
        assert part.status_code == 206 and await _body(part) == BODY[5:15]


@pytest.mark.django_db
async def test_a_missing_file_falls_through_to_django(static_root):
    response = await AsyncClient().get("/static/admin/css/missing.css")
    assert response.status_code == 404 and "Content-Security-Policy" in response


@pytest.mark.parametrize("path", ["/static/../settings.py", "/static/admin/css/../../../etc/passwd",
                                  "/static/%2e%2e/%2e%2e/etc/passwd"])
@pytest.mark.django_db
async def test_nothing_outside_static_root_is_served(static_root, path):
    (static_root.parent / "settings.py").write_text("SECRET = 1")
    response = await AsyncClient().get(path)
    assert response.status_code == 404
