"""Exact metering through a real gateway socket: the worker's counts on every path, the usage journal,
the reservation as the worker's allowance, and the sweeper for requests whose gateway died."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading

import httpx
import pytest
from asgiref.sync import sync_to_async

from controlplane.gateway.models import InflightRequest
from controlplane.gateway.usage import journal, sweeper, usage_writer

from . import sink
from .fake_worker import CACHED_TOKENS, PROMPT_TOKENS
from .test_live_gateway import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "tell me a long story please"}]}


def stream_and_leave(base_url: str, secret: str, body: dict, events: int) -> str:
    """Read `events` data events of a stream, then close the connection; the request id."""
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{base_url}/v1/chat/completions", json={**body, "stream": True},
                           headers={"Authorization": f"Bearer {secret}"}) as response:
            assert response.status_code == 200
            seen = 0
            for line in response.iter_lines():
                assert not line.startswith(": usage"), "the worker's accounting frames must not reach the client"
                seen += line.startswith("data: ")
                if seen == events:
                    return response.headers["x-request-id"]
    raise AssertionError("the stream ended early")


def the_worker(workers, request_id: str):
    (worker,) = [w for w in workers if request_id in w.usage]
    return worker


def test_partial_stream_is_billed_the_tokens_the_worker_generated_not_the_deltas(live_gateway, tenant_key, workers):
    # The reproduction: a stop string makes the worker send many tokens per event; counting
    # deltas billed 1 per event. The worker's own counts are billed, prompt included.
    _, secret = tenant_key.sync()
    for w in workers:
        w.tokens_per_event, w.token_delay = 10, 0.05
    request_id = stream_and_leave(live_gateway, secret, {**CHAT, "max_tokens": 200}, events=2)
    wait_for(lambda: len(sink.EVENTS) == 1)
    (event,) = sink.EVENTS
    reported = the_worker(workers, request_id).usage[request_id]
    assert reported["state"] == "finished" and reported["status"] == "cancelled"
    assert event.request_id == request_id and event.status == "partial" and event.http_status == 499
    assert event.completion_tokens == reported["completion_tokens"] >= 20  # 2 events of 10 tokens reached the client
    assert (event.prompt_tokens, event.cached_tokens) == (PROMPT_TOKENS, CACHED_TOKENS)  # the worker's, not an estimate


def test_a_client_that_leaves_right_after_done_got_the_whole_answer(live_gateway, tenant_key, workers):
    # The worker's body ends a moment after its [DONE]; a client (the openai SDK) that closes at [DONE]
    # was served in full: ok and 200 with the stream's own usage, not a 499 "partial".
    _, secret = tenant_key.sync()
    for w in workers:
        w.linger_after_done = 1.0
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{live_gateway}/v1/chat/completions", json={**CHAT, "max_tokens": 5, "stream": True},
                           headers={"Authorization": f"Bearer {secret}"}) as response:
            for line in response.iter_lines():
                if line == "data: [DONE]":
                    break
            else:
                raise AssertionError("no [DONE]")
            request_id = response.headers["x-request-id"]
    wait_for(lambda: len(sink.EVENTS) == 1)
    (event,) = sink.EVENTS
    assert event.request_id == request_id and (event.status, event.http_status) == ("ok", 200)
    assert (event.prompt_tokens, event.completion_tokens) == (PROMPT_TOKENS, 5)


def test_a_worker_that_cannot_say_leaves_the_counts_of_the_last_relayed_event(live_gateway, tenant_key, workers):
    _, secret = tenant_key.sync()
    for w in workers:
        w.tokens_per_event, w.token_delay, w.forget_usage = 10, 0.05, True  # its usage route answers 404
    stream_and_leave(live_gateway, secret, {**CHAT, "max_tokens": 200}, events=3)
    wait_for(lambda: len(sink.EVENTS) == 1)
    event = sink.EVENTS[0]
    assert event.completion_tokens >= 30 and event.prompt_tokens == PROMPT_TOKENS


def test_the_reservation_is_the_workers_allowance_and_the_journal_holds_the_request_meanwhile(
        live_gateway, tenant_key, workers):
    tenant, secret = tenant_key.sync(monthly_token_budget=100_000, budget_enforcement="hard")
    for w in workers:
        w.hold = threading.Event()
    outcome = {}

    def call():
        outcome["response"] = httpx.post(f"{live_gateway}/v1/chat/completions", json={**CHAT, "max_tokens": 5},
                                         headers={"Authorization": f"Bearer {secret}"}, timeout=10)

    thread = threading.Thread(target=call)
    thread.start()
    wait_for(lambda: any(w.received for w in workers))
    (received,) = [r for w in workers for r in w.received]
    wait_for(InflightRequest.objects.exists)  # written while the worker starts (and before any byte is relayed)
    rows = list(InflightRequest.objects.all())
    assert len(rows) == 1 and rows[0].request_id == received.headers["x-request-id"]
    assert rows[0].tenant_id == tenant.pk and rows[0].worker_url in {w.url for w in workers}
    assert int(received.headers["x-token-allowance"]) == rows[0].reserved_tokens == rows[0].prompt_estimate + 5
    # Under a hard budget the prompt is reserved at its bound: one token per byte the template renders.
    from controlplane.gateway import parsing

    parsed = parsing.parse(__import__("json").dumps({**CHAT, "max_tokens": 5}).encode(), "chat")
    assert rows[0].prompt_estimate == parsed.prompt_bound > parsed.prompt_estimate
    assert received.headers["x-tessera-accounting"] == "1"
    for w in workers:
        w.release()
    thread.join()
    assert outcome["response"].status_code == 200
    wait_for(lambda: len(sink.EVENTS) == 1)
    wait_for(lambda: not InflightRequest.objects.exists())  # gone with the usage write


@pytest.mark.parametrize("stream", [False, True])
async def test_no_journal_no_service(gateway, tenant_key, workers, monkeypatch, drain, stream):
    """A request whose usage could not be made crash-safe (neither the database nor the local spool took
    its journal row) is refused (503). The row is written while the worker starts on the request, so the
    worker may have it; but nothing of its answer reaches the client, the connection to it is closed as
    soon as the row fails (it stops generating: seen leaving, never finishing), and nothing is billed."""
    from django.test import AsyncClient

    from controlplane.gateway.usage.spool import SpoolFull

    async def down(admission):
        await asyncio.sleep(0.2)  # the worker has the request by now
        raise SpoolFull(28, "usage spool is full")

    for w in workers:
        w.token_delay = 0.5  # 3 tokens: 1.5 s of generating, long past the row's failure
    monkeypatch.setattr(usage_writer, "admit", down)
    _, secret = await tenant_key(max_concurrent_requests=1)
    response = await AsyncClient().post("/v1/chat/completions", data={**CHAT, "max_tokens": 3, "stream": stream},
                                        content_type="application/json", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 503 and response.json()["error"]["code"] == "usage_unavailable"
    assert int(response["Retry-After"]) >= 1
    received = [r.headers["x-request-id"] for w in workers for r in w.received]
    assert len(received) == 1  # the worker had it: it saw the gateway leave, and did not finish it
    wait_for(lambda: set(received) <= {rid for w in workers for rid in w.disconnected})
    assert not any(w.finished for w in workers)
    await drain()
    assert all(e.prompt_tokens == e.completion_tokens == 0 for e in sink.EVENTS)  # nothing billed
    monkeypatch.undo()
    response = await AsyncClient().post("/v1/chat/completions", data={**CHAT, "max_tokens": 3},
                                        content_type="application/json", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200  # the refused request's concurrency seat was released


# --- the sweeper ---------------------------------------------------------------------------------------


async def orphan(tenant, worker_url: str, request_id: str, reserved: int = 60, batch_id: str = ""):
    """What a gateway killed mid-request leaves: a reservation in the limiter and a journal row."""
    from tenants.limits import BudgetSeed, LimitPlan, get_limiter, period_start
    from tenants.selectors import tenant_limits

    limits = await sync_to_async(lambda: tenant_limits(tenant=type(tenant).objects.select_related("tier").get(pk=tenant.pk)))()
    plan = LimitPlan(tenant.pk, request_id, limits, reserved, 0)
    decision = await get_limiter().reserve(plan)
    if decision is None:  # a budget and no counter yet this month
        decision = await get_limiter().reserve(plan, seed=BudgetSeed())
    assert decision.allowed
    await usage_writer.admit(journal.Admission(
        request_id=request_id, tenant_id=tenant.pk, api_key_id=None, model="fake-model", adapter=None,
        tier=limits.tier, prompt_estimate=10, reserved_tokens=reserved, reserved_spend_nano=0,
        period_start=period_start(), worker_url=worker_url, created_at=dt.datetime.now(dt.UTC), batch_id=batch_id))
    return limits


async def limiter_state(tenant):
    from tenants.models import BudgetPeriod, Reservation

    def read():
        budget = BudgetPeriod.objects.filter(tenant_id=tenant.pk).first()
        return Reservation.objects.filter(tenant_id=tenant.pk).count(), budget.tokens if budget else 0

    return await sync_to_async(read)()


async def test_sweeper_bills_a_dead_gateways_request_from_the_workers_counts(gateway, tenant_key, workers):
    tenant, _ = await tenant_key(max_concurrent_requests=2, monthly_token_budget=10_000)
    worker = workers[0]
    worker.usage["req_dead"] = {"state": "finished", "status": "cancelled", "prompt_tokens": 12, "cached_tokens": 4,
                                "completion_tokens": 33}
    worker.usage["req_live"] = {"state": "running", "status": "running", "prompt_tokens": 12, "cached_tokens": 0,
                                "completion_tokens": 5}
    await orphan(tenant, worker.url, "req_dead")
    await orphan(tenant, worker.url, "req_live")
    assert await limiter_state(tenant) == (2, 120)

    report = await sweeper.sweep(min_age=0)
    assert report.billed_from_worker == ["req_dead"] and report.still_running == ["req_live"]
    (event,) = sink.EVENTS
    assert (event.request_id, event.prompt_tokens, event.cached_tokens, event.completion_tokens) == ("req_dead", 12, 4, 33)
    assert event.status == "error" and event.tenant_id == tenant.pk  # the client's connection died with its gateway
    assert await limiter_state(tenant) == (1, 45 + 60)  # settled to what was served; the live one still reserved
    assert await sync_to_async(lambda: list(InflightRequest.objects.values_list("request_id", flat=True)))() == ["req_live"]

    assert (await sweeper.sweep(min_age=0)).billed_from_worker == []  # idempotent
    assert len(sink.EVENTS) == 1


async def test_sweeper_bills_a_dead_batch_runners_line_on_the_batch_price_line(gateway, tenant_key, workers):
    """A batch line whose runner died mid-line is swept like any request, and billed as a batch line."""
    tenant, _ = await tenant_key(monthly_token_budget=10_000)
    workers[0].usage["req_b7_line"] = {"state": "finished", "status": "ok", "prompt_tokens": 5, "cached_tokens": 0,
                                       "completion_tokens": 9}
    await orphan(tenant, workers[0].url, "req_b7_line", batch_id="batch_dead_runner")
    assert (await sweeper.sweep(min_age=0)).billed_from_worker == ["req_b7_line"]
    (event,) = sink.EVENTS
    assert (event.batch_id, event.prompt_tokens, event.completion_tokens) == ("batch_dead_runner", 5, 9)


async def test_sweeper_releases_a_request_no_worker_had_and_bills_the_reservation_only_when_it_gives_up(
        gateway, tenant_key, workers):
    tenant, _ = await tenant_key(monthly_token_budget=10_000)
    await orphan(tenant, workers[0].url, "req_never_arrived")  # the worker answers 404: it never had it
    await orphan(tenant, "http://127.0.0.1:9", "req_worker_gone", reserved=50)  # nobody answers there

    report = await sweeper.sweep(min_age=0, give_up_after=3600)
    assert report.billed_from_worker == ["req_never_arrived"] and report.waiting == ["req_worker_gone"]
    assert sink.EVENTS[0].completion_tokens == sink.EVENTS[0].prompt_tokens == 0
    assert await limiter_state(tenant) == (1, 50)

    report = await sweeper.sweep(min_age=0, give_up_after=0)
    assert report.billed_reservation == ["req_worker_gone"]
    billed = sink.EVENTS[1]
    assert (billed.prompt_tokens, billed.completion_tokens) == (10, 40)  # the estimate, and the rest of the allowance
    assert await limiter_state(tenant) == (0, 50)
    assert not await sync_to_async(InflightRequest.objects.exists)()


def test_sweep_command_and_beat_entry(settings):
    from django.core.management import call_command

    from controlplane.gateway import tasks

    assert settings.CELERY_BEAT_SCHEDULE["gateway-usage-sweep"]["task"] == tasks.usage_sweep.name
    out = __import__("io").StringIO()
    call_command("usage_sweep", "--min-age", "0", stdout=out)
    assert "billed_from_worker=0" in out.getvalue()


def test_celery_task_runs_the_sweep(gateway, tenant_key, workers):
    tenant, _ = tenant_key.sync()
    workers[0].usage["req_task"] = {"state": "finished", "status": "ok", "prompt_tokens": 3, "cached_tokens": 0,
                                    "completion_tokens": 2}
    asyncio.run(orphan(tenant, workers[0].url, "req_task"))
    gateway.TESSERA_USAGE_SWEEP_MIN_AGE_SECONDS = 0
    from controlplane.gateway import tasks

    assert tasks.usage_sweep.apply().get()["billed_from_worker"] == 1
    assert sink.EVENTS[0].completion_tokens == 2


def test_without_a_hard_budget_the_worker_gets_no_allowance(live_gateway, tenant_key, workers):
    """Rate limits settle to what was served; a low estimate must not cut a request short."""
    _, secret = tenant_key.sync(tokens_per_minute=100_000, monthly_token_budget=100_000, budget_enforcement="soft")
    response = httpx.post(f"{live_gateway}/v1/chat/completions", json={**CHAT, "max_tokens": 3},
                          headers={"Authorization": f"Bearer {secret}"}, timeout=10)
    assert response.status_code == 200
    (received,) = [r for w in workers for r in w.received]
    assert "x-token-allowance" not in received.headers and received.headers["x-tessera-accounting"] == "1"


async def test_group_commit_fails_only_the_journal_row_that_cannot_be_written(gateway, tenant_key):
    """Journal rows and usage events share one writer thread and one transaction per batch; a row that
    cannot be written (here a duplicate id) fails its own request only."""
    from django.db import IntegrityError

    from billing.events import UsageEvent
    from controlplane.gateway.usage import usage_writer
    from tenants.limits import period_start

    tenant, _ = await tenant_key()
    writer = usage_writer.writer_for(sink.collect)
    row = journal.Admission(
        request_id="req_twice", tenant_id=tenant.pk, api_key_id=None, model="fake-model", adapter=None, tier="t",
        prompt_estimate=1, reserved_tokens=2, reserved_spend_nano=0, period_start=period_start(),
        worker_url="http://w", created_at=dt.datetime.now(dt.UTC))
    event = UsageEvent("req_other", tenant.pk, None, "fake-model", None, "t", 5, 0, 1, None, 3.0, "ok",
                       dt.datetime.now(dt.UTC))
    first, second, written = await asyncio.gather(writer.admit(row), writer.admit(row), writer.submit(event),
                                                  return_exceptions=True)
    assert first is None and isinstance(second, IntegrityError) and written is None
    assert [e.request_id for e in sink.EVENTS] == ["req_other"]
    assert await sync_to_async(lambda: list(InflightRequest.objects.values_list("request_id", flat=True)))() == ["req_twice"]


async def test_metrics_show_the_journal_and_the_alert_rules_name_real_series(gateway, tenant_key, workers):
    """What the sweeper has not finished is visible to Prometheus, and the shipped alerts read it."""
    from pathlib import Path

    import yaml
    from django.test import AsyncClient

    from controlplane.gateway.usage.journal_metrics import JOURNAL_COLLECTOR

    tenant, _ = await tenant_key(max_concurrent_requests=5)
    await orphan(tenant, workers[0].url, "req_fresh")
    await orphan(tenant, workers[0].url, "req_old")
    await orphan(tenant, workers[0].url, "req_owed")

    def age():
        old = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=gateway.TESSERA_USAGE_SWEEP_MIN_AGE_SECONDS + 300)
        InflightRequest.objects.filter(request_id="req_old").update(admitted_at=old)
        InflightRequest.objects.filter(request_id="req_owed").update(unsettled_prompt_tokens=3, unsettled_completion_tokens=4)

    await sync_to_async(age)()
    JOURNAL_COLLECTOR.clear()
    text = (await AsyncClient().get("/metrics")).content.decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("tessera_usage_journal"))
    assert samples['tessera_usage_journal_rows{state="in_flight"}'] == "1.0"
    assert samples['tessera_usage_journal_rows{state="orphaned"}'] == "1.0"
    assert samples['tessera_usage_journal_rows{state="unsettled"}'] == "1.0"
    assert float(samples["tessera_usage_journal_oldest_orphan_seconds"]) >= 300

    rules = yaml.safe_load(Path("deploy/prometheus/tessera-usage-rules.yml").read_text())["groups"][0]["rules"]
    exprs = " ".join(rule["expr"] for rule in rules)
    for series in ("tessera_usage_journal_oldest_orphan_seconds", 'tessera_usage_journal_rows{state="unsettled"}'):
        assert series in exprs and series.split("{")[0] in text


@pytest.mark.parametrize("stream", [False, True])
async def test_the_journal_row_is_written_while_the_worker_starts_and_before_any_byte_is_relayed(
        gateway, tenant_key, workers, monkeypatch, drain, stream):
    """The row's commit (queued behind the writer's other rows) no longer delays the worker: the worker
    has the request while the row is being written. But the client's answer starts only once the row is
    durable, so a gateway that dies mid-answer always leaves a row for the sweeper."""
    from controlplane.asgi import application

    from .asgi_driver import call

    loop = asyncio.get_running_loop()
    marks: dict[str, float | bool] = {}
    real_admit = usage_writer.admit

    async def slow_admit(admission):
        await asyncio.sleep(0.3)  # a writer busy with other rows
        marks["worker_had_it"] = any(w.received for w in workers)
        await real_admit(admission)
        marks["durable"] = loop.time()

    async def app(scope, receive, send):
        async def timed(message):
            if message["type"] == "http.response.start":
                marks.setdefault("answer_started", loop.time())
            await send(message)
        await application(scope, receive, timed)

    monkeypatch.setattr(usage_writer, "admit", slow_admit)
    _, secret = await tenant_key()
    body = json.dumps({**CHAT, "max_tokens": 3, "stream": stream}).encode()
    reply = await call(app, "/v1/chat/completions", [body], headers={"authorization": f"Bearer {secret}"})
    assert reply.status == 200
    assert marks["worker_had_it"] is True  # sent while the row was being written
    assert marks["answer_started"] >= marks["durable"]  # nothing relayed before the row was durable
    await drain()
    assert not await sync_to_async(InflightRequest.objects.exists)()  # and gone with the ledger row


async def test_a_client_that_leaves_while_its_journal_row_is_written_is_billed_once(
        gateway, tenant_key, workers, monkeypatch, drain):
    """The worst moment now that the row is written while the worker starts: the client leaves after the
    worker has the request and before the row is durable. The row still commits, the worker is told to
    stop, and the request ends with exactly one usage event and no journal row left behind."""
    from controlplane.asgi import application

    from .asgi_driver import call

    real_admit = usage_writer.admit

    async def slow_admit(admission):
        await asyncio.sleep(0.3)
        await real_admit(admission)

    for w in workers:
        w.token_delay = 0.2
    monkeypatch.setattr(usage_writer, "admit", slow_admit)
    _, secret = await tenant_key()
    body = json.dumps({**CHAT, "max_tokens": 5, "stream": True}).encode()
    client = asyncio.create_task(call(application, "/v1/chat/completions", [body],
                                      headers={"authorization": f"Bearer {secret}"}))
    for _ in range(300):
        if any(w.received for w in workers):
            break
        await asyncio.sleep(0.01)
    client.cancel()  # the client leaves: the worker has the request, its row is still being written
    with pytest.raises(asyncio.CancelledError):
        await client
    received = [r.headers["x-request-id"] for w in workers for r in w.received]
    assert len(received) == 1
    await asyncio.sleep(0.5)  # the row commits meanwhile
    await drain()
    events = [e for e in sink.EVENTS if e.request_id == received[0]]
    assert len(events) == 1 and events[0].status == "partial"
    assert not await sync_to_async(InflightRequest.objects.exists)()
    wait_for(lambda: received[0] in {rid for w in workers for rid in w.disconnected})
