"""Bad input is a 4xx in OpenAI's shape (never a 500), bodies are capped before they are read, and the
prompt estimate counts everything the worker renders."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from controlplane.gateway import parsing

from .asgi_driver import call, chat_body
from .test_gateway import CHAT, post

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024


def assert_openai_error(response_json: dict, status_param=None):
    error = response_json["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if status_param is not None:
        assert error["param"] == status_param


# --- the reproduced 500s --------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "stream": True, "stream_options": "x"}, "stream_options"),  # was a 500 (dict("x"))
        ({**CHAT, "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
         "messages[0].content[0].text"),  # was a 500 ("".join over None)
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
         "messages[0].content[0].text"),
        ({**CHAT, "messages": [{"role": "user", "content": ["hi"]}]}, "messages[0].content[0]"),
        ({**CHAT, "messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        ({**CHAT, "messages": [{"role": 1, "content": "x"}]}, "messages[0].role"),
        ({**CHAT, "messages": [{"content": "x"}]}, "messages[0].role"),
        ({**CHAT, "messages": [{"role": "user", "content": "x", "name": 3}]}, "messages[0].name"),
        ({**CHAT, "messages": [{"role": "assistant", "content": None, "tool_calls": "x"}]}, "messages[0].tool_calls"),
        ({**CHAT, "messages": ["hello"]}, "messages[0]"),
        ({**CHAT, "messages": "hello"}, "messages"),
        ({**CHAT, "tools": {"type": "function"}}, "tools"),
        ({**CHAT, "tools": ["x"]}, "tools"),
        ({**CHAT, "n": "2"}, "n"),
        ({**CHAT, "n": 129}, "n"),
        ({**CHAT, "max_tokens": 1.5}, "max_tokens"),
        ({**CHAT, "max_tokens": True}, "max_tokens"),
        ({**CHAT, "max_tokens": 18446744073709551615}, "max_tokens"),  # u64: overflowed the limiter's bigint
        ({**CHAT, "max_completion_tokens": -1}, "max_completion_tokens"),
        ({**CHAT, "model": 5}, "model"),
    ],
)
async def test_malformed_fields_the_gateway_reads_are_400_naming_the_param(gateway, tenant_key, workers, body, param):
    _, secret = await tenant_key()
    response = await post(AsyncClient(), secret, body)
    assert response.status_code == 400, response.content
    assert_openai_error(response.json(), param)
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert not [r for w in workers for r in w.received]  # refused before any worker saw it


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake-model", "prompt": [[1, 2], "x"]}, "prompt"),
        ({"model": "fake-model", "prompt": []}, "prompt"),
        ({"model": "fake-model"}, "prompt"),
        ({"model": "fake-model", "prompt": "x", "stream_options": [1]}, "stream_options"),
        ({"model": "fake-model", "prompt": "x", "max_tokens": "9"}, "max_tokens"),
    ],
)
async def test_malformed_completions_are_400(gateway, tenant_key, body, param):
    _, secret = await tenant_key()
    response = await post(AsyncClient(), secret, body, "/v1/completions")
    assert response.status_code == 400, response.content
    assert_openai_error(response.json(), param)


async def test_what_the_gateway_does_not_read_passes_through(gateway, tenant_key, workers):
    _, secret = await tenant_key()
    body = {**CHAT, "stream": None, "stream_options": None, "n": None, "temperature": "hot", "x_unknown": {"a": [1]},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}]}
    response = await post(AsyncClient(), secret, body)
    assert response.status_code == 200, response.content  # the fake worker accepts; a real one validates all
    (received,) = [r for w in workers for r in w.received]
    assert received.body == body
    tokens = {"model": "fake-model", "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 2}
    assert (await post(AsyncClient(), secret, tokens, "/v1/completions")).status_code == 200


# --- the body cap ---------------------------------------------------------------------------------

async def test_a_3_mb_body_under_the_cap_is_served_not_a_500(gateway, tenant_key):
    """Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) made this a RequestDataTooBig: internal_error."""
    from controlplane.asgi import application

    _, secret = await tenant_key()
    body = chat_body(3 * MiB)
    reply = await call(application, "/v1/chat/completions", [body], headers={"Authorization": f"Bearer {secret}"})
    assert reply.status == 200, reply.body[:500]


async def test_a_body_over_the_cap_is_413_before_it_is_read(gateway, tenant_key):
    from controlplane.asgi import application

    gateway.TESSERA_MAX_REQUEST_BYTES = 2 * MiB
    _, secret = await tenant_key()
    reply = await call(application, "/v1/chat/completions", [chat_body(3 * MiB)],
                       headers={"Authorization": f"Bearer {secret}"})
    assert reply.status == 413
    assert_openai_error(reply.json())
    assert reply.json()["error"]["code"] == "request_too_large"
    assert reply.headers["x-request-id"].startswith("req_")
    assert reply.receive_calls == 0  # refused on Content-Length alone


async def test_the_default_cap_is_4_mib(gateway, tenant_key):
    from controlplane.asgi import application

    _, secret = await tenant_key()
    reply = await call(application, "/v1/chat/completions", [chat_body(4 * MiB + 1)],
                       headers={"Authorization": f"Bearer {secret}"})
    assert (reply.status, reply.json()["error"]["code"], reply.receive_calls) == (413, "request_too_large", 0)


async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_cap(gateway, tenant_key):
    from controlplane.asgi import application

    gateway.TESSERA_MAX_REQUEST_BYTES = 1 * MiB
    _, secret = await tenant_key()
    chunks = [b"x" * (256 * 1024)] * 40  # 10 MiB offered
    reply = await call(application, "/v1/chat/completions", chunks, content_length=False,
                       headers={"Authorization": f"Bearer {secret}"})
    assert reply.status == 413 and reply.json()["error"]["code"] == "request_too_large"
    assert reply.receive_calls == 5  # 1 MiB + one chunk, not the 40


@pytest.mark.parametrize("authorization", [None, "Basic abc", "Bearer nope", "Bearer sk-not-a-real-key-at-all-0000000"])
async def test_an_anonymous_or_unknown_key_is_refused_before_its_body_is_read(gateway, authorization):
    from controlplane.asgi import application

    headers = {"Authorization": authorization} if authorization else {}
    for chunked in (False, True):
        reply = await call(application, "/v1/chat/completions", [chat_body(3 * MiB)], headers=headers,
                           content_length=not chunked)
        assert reply.status == 401
        assert reply.json()["error"]["code"] == "invalid_api_key"
        assert reply.receive_calls == 0


async def test_a_small_body_with_an_unknown_key_is_still_a_401(gateway):
    from controlplane.asgi import application

    reply = await call(application, "/v1/chat/completions", [json.dumps(CHAT).encode()],
                       headers={"Authorization": "Bearer sk-not-a-real-key-at-all-0000000"})
    assert reply.status == 401 and reply.json()["error"]["code"] == "invalid_api_key"


async def test_the_management_api_and_admin_have_the_same_cap_in_drfs_format(gateway):
    from controlplane.asgi import application

    gateway.TESSERA_MAX_REQUEST_BYTES = 1 * MiB
    for path in ("/api/v1/keys/", "/api/v1/tenants/", "/admin/login/"):
        reply = await call(application, path, [b"x" * (2 * MiB)])
        assert reply.status == 413, (path, reply.body[:200])
        assert reply.json()["code"] == "request_too_large" and "detail" in reply.json()
        assert reply.receive_calls == 0
        reply = await call(application, path, [b"x" * (256 * 1024)] * 40, content_length=False)
        assert reply.status == 413 and reply.json()["code"] == "request_too_large"
        assert reply.receive_calls == 5
    # under the cap: the API answers as usual (anonymous: 401 in DRF's format)
    reply = await call(application, "/api/v1/keys/", [b"{}"])
    assert reply.status == 401 and "detail" in reply.json()


def test_django_accepts_what_the_cap_accepts(settings):
    from django.conf import settings as live

    assert live.DATA_UPLOAD_MAX_MEMORY_SIZE == live.TESSERA_MAX_REQUEST_BYTES == 4 * MiB


# --- the prompt estimate --------------------------------------------------------------------------

def _estimate(body: dict, kind: str = "chat") -> int:
    return parsing.parse(json.dumps(body).encode(), kind).prompt_estimate


def test_tools_are_counted_in_the_estimate(settings):
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "d" * 2000,
                                               "parameters": {"type": "object", "properties": {}}}}
             for i in range(100)]
    size = len(json.dumps(tools))
    assert size > 200_000
    estimate = _estimate({**CHAT, "tools": tools})
    assert estimate >= size / parsing.BYTES_PER_TOKEN  # was 8 tokens: the message alone
    assert estimate > _estimate(CHAT) + size / parsing.BYTES_PER_TOKEN - 1


def test_tool_calls_names_and_tool_call_ids_are_counted(settings):
    call_json = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": "y" * 3000})}}
    base = [{"role": "user", "content": "hi"}]
    plain = _estimate({**CHAT, "messages": base + [{"role": "assistant", "content": None}]})
    with_calls = _estimate({**CHAT, "messages": base + [{"role": "assistant", "content": None, "tool_calls": [call_json]}]})
    assert with_calls - plain >= 3000 / parsing.BYTES_PER_TOKEN
    named = _estimate({**CHAT, "messages": [{"role": "user", "content": "hi", "name": "n" * 3000}]})
    assert named - _estimate({**CHAT, "messages": [{"role": "user", "content": "hi"}]}) >= 1000
    answered = _estimate({**CHAT, "messages": [{"role": "tool", "content": "ok", "tool_call_id": "c" * 3000}]})
    assert answered - _estimate({**CHAT, "messages": [{"role": "tool", "content": "ok"}]}) >= 1000


def test_the_chat_templates_overhead_is_counted_once_per_chat_request(settings):
    settings.TESSERA_CHAT_TEMPLATE_TOKENS = 32
    one = _estimate(CHAT)
    assert one == 32 + parsing.TOKENS_PER_MESSAGE + 5  # "user" + "Hello there": 15 bytes, 3 per token
    settings.TESSERA_CHAT_TEMPLATE_TOKENS = 100
    assert _estimate(CHAT) == one + 68
    prompt = {"model": "fake-model", "prompt": "x" * 30}
    assert _estimate(prompt, "completions") == 10  # completions have no template


def test_the_estimate_errs_high_against_smollm2_on_prose(settings):
    """With SmolLM2's real tokenizer and chat template: never below the truth for prose. Not a bound in
    general: SmolLM2 splits digits one per token, so numbers run ~1 byte/token, CJK ~1.4, JSON ~1.8,
    code ~2.2 (measured; docs/controlplane.md, Input limits)."""
    import jinja2

    from dataplane.models.registry import resolve_model_path
    from dataplane.models.tokenizer import Tokenizer

    # Converted from the installed GGUF (cached on disk after the first time), so this never skips.
    smollm2 = Tokenizer.from_gguf(resolve_model_path("smollm2-135m-instruct"), ())
    tokenizer = smollm2.backend
    template = jinja2.Environment().from_string(smollm2.hf.chat_template)
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Tell me about the weather in Paris. " * 20}, {"role": "assistant", "content": "Sunny."}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 30}],
    ]
    for messages in conversations:
        text = template.render(messages=messages, add_generation_prompt=True)
        truth = len(tokenizer.encode(text, add_special_tokens=False).ids)
        assert _estimate({"model": "m", "messages": messages}) >= truth, messages
