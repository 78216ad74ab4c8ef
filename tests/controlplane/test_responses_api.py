"""/v1/responses with the official `openai` client → the live gateway (uvicorn) → fake workers: the
translation to chat, metering, the store (per tenant, retention, cascade) and what is refused."""

from __future__ import annotations

import datetime as dt
import json
import time

import httpx
import openai
import pytest

from . import sink
from .fake_worker import CACHED_TOKENS, PROMPT_TOKENS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client_for(live_gateway):
    def make(secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{live_gateway}/v1", api_key=secret, max_retries=0, timeout=30)

    return make


def wait_events(n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(sink.EVENTS) < n:
        assert time.monotonic() < deadline, f"{len(sink.EVENTS)} of {n} usage events"
        time.sleep(0.05)


def chat_requests(workers) -> list[dict]:
    return [r.body for w in workers for r in w.received if r.path == "/v1/chat/completions"]


def test_create_translates_to_chat_and_meters_like_chat(client_for, tenant_key, workers):
    tenant, secret = tenant_key.sync(requests_per_minute=100, tokens_per_minute=100_000)
    response = client_for(secret).responses.create(
        model="fake-model", input="Hello there", instructions="Be brief.", max_output_tokens=3, temperature=0.5,
        top_p=0.9, metadata={"run": "7"},
    )
    (sent,) = chat_requests(workers)
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"]) == (3, 0.5, 0.9) and "stream" not in sent
    assert response.id.startswith("resp_") and response.object == "response"
    # The fake worker always stops at max_tokens: OpenAI's "incomplete" for max_output_tokens.
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "t0 t1 t2 " and response.output[0].role == "assistant"
    assert response.usage.input_tokens == PROMPT_TOKENS and response.usage.output_tokens == 3
    assert response.usage.input_tokens_details.cached_tokens == CACHED_TOKENS
    assert response.usage.total_tokens == PROMPT_TOKENS + 3 and response.metadata == {"run": "7"}
    wait_events(1)
    (event,) = sink.EVENTS  # the chat path's meter: the ledger row's request id is the response's
    assert event.request_id == "req_" + response.id.removeprefix("resp_")
    assert (event.tenant_id, event.status, event.completion_tokens) == (tenant.pk, "ok", 3)


def test_stream_emits_semantic_events_and_meters_once(client_for, tenant_key, workers):
    _, secret = tenant_key.sync(requests_per_minute=100)
    client = client_for(secret)
    events = list(client.responses.create(model="fake-model", input="Hi", max_output_tokens=4, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds.count("response.output_text.delta") == 4
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "t0 t1 t2 t3 " and final.usage.output_tokens == 4
    assert final.usage.input_tokens_details.cached_tokens == CACHED_TOKENS
    (sent,) = chat_requests(workers)
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}

    with client.responses.stream(model="fake-model", input="Hi", max_output_tokens=2) as stream:
        streamed_events = list(stream)  # ends in response.incomplete, which get_final_response does not take
    deltas = [e.delta for e in streamed_events if e.type == "response.output_text.delta"]
    streamed = streamed_events[-1].response
    assert deltas == ["t0 ", "t1 "] and streamed.output_text == "t0 t1 "
    assert client.responses.retrieve(streamed.id).output_text == "t0 t1 "  # stored before its last event
    wait_events(2)
    assert sorted(e.completion_tokens for e in sink.EVENTS) == [2, 4]
    assert {e.status for e in sink.EVENTS} == {"ok"} and sum(sink.DELIVERIES.values()) == 2


def test_previous_response_id_continues_the_conversation(client_for, tenant_key, workers):
    _, secret = tenant_key.sync(requests_per_minute=100)
    client = client_for(secret)
    first = client.responses.create(model="fake-model", input="My name is Ada.", instructions="Be kind.",
                                    max_output_tokens=2)
    second = client.responses.create(model="fake-model", input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=2)
    assert second.previous_response_id == first.id
    third = client.responses.create(model="fake-model", input=[{"role": "user", "content": "Again?"}],
                                    previous_response_id=second.id, max_output_tokens=1, stream=False)
    sent = sorted(chat_requests(workers), key=lambda body: len(body["messages"]))
    # Instructions are not carried over (as OpenAI): only the turns and answers are.
    assert sent[1]["messages"] == [
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "t0 t1 "},
        {"role": "user", "content": "What is my name?"}]
    assert sent[2]["messages"][-3:] == [
        {"role": "user", "content": "What is my name?"}, {"role": "assistant", "content": "t0 t1 "},
        {"role": "user", "content": "Again?"}]
    client.responses.delete(first.id)  # a deleted ancestor does not break the ones that continued it
    client.responses.create(model="fake-model", input="Still?", previous_response_id=third.id, max_output_tokens=1)
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="fake-model", input="x", previous_response_id=first.id)
    assert exc.value.body["param"] == "previous_response_id"


def test_function_calls_and_outputs_become_tool_messages(client_for, tenant_key, workers):
    _, secret = tenant_key.sync(requests_per_minute=100)
    tools = [{"type": "function", "name": "get_weather", "description": "Weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    client_for(secret).responses.create(
        model="fake-model", tools=tools, tool_choice={"type": "function", "name": "get_weather"},
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
        parallel_tool_calls=False, max_output_tokens=2,
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Lyon"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "function_call_output", "call_id": "call_2", "output": "21C"},
        ])
    (sent,) = chat_requests(workers)
    assert sent["tools"] == [{"type": "function", "function": {k: tools[0][k] for k in ("name", "description",
                                                                                           "parameters")}}]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True}}
    assert sent["parallel_tool_calls"] is False
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21C"}]


def test_another_tenants_response_is_not_found(client_for, tenant_key, workers):
    _, secret_a = tenant_key.sync(requests_per_minute=100)
    _, secret_b = tenant_key.sync(requests_per_minute=100)
    mine = client_for(secret_a).responses.create(model="fake-model", input="secret", max_output_tokens=1)
    other = client_for(secret_b)
    for attempt in (lambda: other.responses.retrieve(mine.id), lambda: other.responses.delete(mine.id),
                    lambda: other.responses.create(model="fake-model", input="x", previous_response_id=mine.id)):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert len(chat_requests(workers)) == 1  # the refused continuation never reached a worker
    assert client_for(secret_a).responses.retrieve(mine.id).output_text == "t0 "


def test_store_false_is_not_kept_and_delete_removes(client_for, tenant_key, workers):
    _, secret = tenant_key.sync(requests_per_minute=100)
    client = client_for(secret)
    ephemeral = client.responses.create(model="fake-model", input="x", max_output_tokens=1, store=False)
    assert ephemeral.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ephemeral.id)
    kept = client.responses.create(model="fake-model", input="x", max_output_tokens=1)
    assert kept.store is True and client.responses.retrieve(kept.id).id == kept.id
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)


def test_retention_and_tenant_deletion(client_for, tenant_key, workers, settings):
    from django.core.management import call_command

    from controlplane.gateway.models import StoredResponse

    tenant, secret = tenant_key.sync(requests_per_minute=100)
    client = client_for(secret)
    old = client.responses.create(model="fake-model", input="x", max_output_tokens=1)
    new = client.responses.create(model="fake-model", input="y", max_output_tokens=1)
    StoredResponse.objects.filter(id=old.id).update(created_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=31))
    settings.TESSERA_RESPONSES_RETENTION_DAYS = 30
    with pytest.raises(openai.NotFoundError):  # past retention: gone for reads before the prune runs
        client.responses.retrieve(old.id)
    call_command("responses_prune")
    assert list(StoredResponse.objects.values_list("id", flat=True)) == [new.id]
    tenant.delete()
    assert not StoredResponse.objects.exists()


UNSUPPORTED = [
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True}, "background"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": 5}, "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
]


@pytest.mark.parametrize(("extra", "param"), UNSUPPORTED)
def test_what_is_not_supported_is_refused_naming_the_field(live_gateway, tenant_key, workers, extra, param):
    _, secret = tenant_key.sync(requests_per_minute=100)
    body = {"model": "fake-model", "input": "x", **extra}
    response = httpx.post(f"{live_gateway}/v1/responses", json=body, headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and response.headers["x-request-id"].startswith("req_")
    assert chat_requests(workers) == []
    assert sink.EVENTS == []


def test_malformed_and_unauthenticated(live_gateway, tenant_key, workers):
    _, secret = tenant_key.sync(requests_per_minute=100)
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    for raw in (b"{", b"[]", json.dumps({"input": "x"}).encode()):
        response = httpx.post(f"{live_gateway}/v1/responses", content=raw, headers=headers)
        assert response.status_code == 400 and "error" in response.json()
    assert httpx.post(f"{live_gateway}/v1/responses", json={"model": "fake-model", "input": "x"}).status_code == 401
    assert httpx.get(f"{live_gateway}/v1/responses/resp_x").status_code == 401
    assert httpx.put(f"{live_gateway}/v1/responses/resp_x", headers=headers).status_code == 405


def test_limits_and_budgets_hold_as_for_chat(client_for, tenant_key, workers):
    _, secret = tenant_key.sync(requests_per_minute=1)
    client = client_for(secret)
    client.responses.create(model="fake-model", input="x", max_output_tokens=1)
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="fake-model", input="x", max_output_tokens=1)
    _, budgeted = tenant_key.sync(requests_per_minute=100, monthly_token_budget=200, budget_enforcement="hard")
    budget_client = client_for(budgeted)
    with pytest.raises(openai.RateLimitError) as exc:
        budget_client.responses.create(model="fake-model", input="x", max_output_tokens=1000)
    assert exc.value.code == "insufficient_quota"
    # Under a hard budget the worker is told what was reserved, as on the chat path.
    budget_client.responses.create(model="fake-model", input="x", max_output_tokens=5)
    (last,) = [r for w in workers for r in w.received if r.body.get("max_tokens") == 5]
    assert 5 < int(last.headers["x-token-allowance"]) <= 200


def test_store_is_refused_while_the_database_is_known_down(client_for, tenant_key, workers):
    from controlplane.gateway import outages

    _, secret = tenant_key.sync(requests_per_minute=100)
    client = client_for(secret)
    client.models.list()  # the key is now in the process's last-known cache
    outages.mark_down("database")
    try:
        with pytest.raises(openai.InternalServerError) as exc:
            client.responses.create(model="fake-model", input="x", max_output_tokens=1)
        assert exc.value.status_code == 503 and exc.value.body["code"] == "store_unavailable"
        assert client.responses.create(model="fake-model", input="x", max_output_tokens=1, store=False).output_text
    finally:
        outages._down_until.clear()


def test_a_failed_store_still_delivers_and_says_so(client_for, tenant_key, workers, monkeypatch):
    from controlplane.gateway.responses import responses_store

    def broken(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(responses_store, "stored_response_create", broken)
    _, secret = tenant_key.sync(requests_per_minute=100)
    response = client_for(secret).responses.create(model="fake-model", input="x", max_output_tokens=1)
    assert response.output_text == "t0 " and response.store is False
    wait_events(1)
    assert sink.EVENTS[0].completion_tokens == 1


def test_a_client_that_leaves_mid_stream_is_billed_what_was_generated(live_gateway, tenant_key, workers):
    for worker in workers:
        worker.token_delay = 0.05
    _, secret = tenant_key.sync(requests_per_minute=100)
    body = {"model": "fake-model", "input": "x", "max_output_tokens": 100, "stream": True}
    with httpx.stream("POST", f"{live_gateway}/v1/responses", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {secret}"}) as response:
        for line in response.iter_lines():
            if "response.output_text.delta" in line:
                break
    wait_events(1)
    (event,) = sink.EVENTS
    assert event.status == "partial" and 1 <= event.completion_tokens < 100
    deadline = time.monotonic() + 5
    while not any(w.disconnected for w in workers):  # the worker stopped generating
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_the_hourly_prune_task_deletes_only_what_is_past_retention(tenant_key, gateway):
    from controlplane.gateway import tasks
    from controlplane.gateway.models import StoredResponse
    from controlplane.gateway.responses.responses_store import PRUNE_BATCH

    tenant, _ = tenant_key.sync()
    now = dt.datetime.now(dt.UTC)
    old = [StoredResponse(id=f"resp_old{i}", tenant=tenant, body={}, context=[],
                          created_at=now - dt.timedelta(days=30, minutes=1)) for i in range(PRUNE_BATCH + 5)]
    StoredResponse.objects.bulk_create([*old, StoredResponse(id="resp_new", tenant=tenant, body={}, context=[],
                                                             created_at=now - dt.timedelta(days=29))])
    assert tasks.responses_prune() == PRUNE_BATCH + 5  # more than one batch
    assert list(StoredResponse.objects.values_list("id", flat=True)) == ["resp_new"]
    assert gateway.CELERY_BEAT_SCHEDULE["gateway-responses-prune"]["task"] == tasks.responses_prune.name


def test_input_items_list_pages_through_what_the_model_saw(client_for, tenant_key, workers):
    _, secret = tenant_key.sync(requests_per_minute=100)
    _, other = tenant_key.sync(requests_per_minute=100)
    client = client_for(secret)
    first = client.responses.create(model="fake-model", input="My name is Ada.", instructions="Be kind.",
                                    max_output_tokens=2)
    second = client.responses.create(model="fake-model", previous_response_id=first.id, max_output_tokens=1, input=[
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"}])
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert [i.type for i in items] == ["message", "message", "function_call", "function_call_output"]
    assert (items[0].role, items[0].content[0].text) == ("user", "My name is Ada.")
    assert (items[1].role, items[1].id) == ("assistant", first.output[0].id)  # the earlier answer, as it was
    assert (items[3].call_id, items[3].output) == ("call_1", "42")
    page = client.responses.input_items.list(second.id, limit=1)  # desc by default
    assert [i.id for i in page.data] == [items[3].id] and page.has_more
    after = client.responses.input_items.list(second.id, limit=2, after=items[3].id)
    assert [i.id for i in after.data] == [items[2].id, items[1].id]
    assert [i.id for i in client.responses.input_items.list(second.id)] == [i.id for i in reversed(items)]
    with pytest.raises(openai.NotFoundError):
        client_for(other).responses.input_items.list(second.id)
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(second.id, limit=0)
