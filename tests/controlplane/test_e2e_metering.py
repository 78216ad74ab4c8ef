"""Money through a real gateway and a real SmolLM2 worker: hard budgets under a 64-way race on
both limiters, and a partial stream billed the tokens the worker generated.

The gateway's prompt estimate is set deliberately low here (no allowance for the chat template's
system prompt): the budget must hold by construction, because the worker serves at most what the
gateway reserved (`X-Token-Allowance`), whatever the estimate.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest
from django.db.models import Sum

from billing.models import UsageRecord
from controlplane.gateway.models import InflightRequest
from tenants.limits import get_limiter, period_start
from tenants.limits.base import from_nano
from tests.dataplane.worker.process import MODEL, running

from .conftest import serving_gateway
from .test_live_gateway import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.django_db(transaction=True)]

RACERS = 64


@pytest.fixture(scope="module")
def metering_worker():
    with running("--dtype", "auto", "--waiting-limits", "") as worker:  # nobody shed: only the budget refuses
        yield worker


@pytest.fixture
def real_gateway(metering_worker, gateway):
    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"  # the real ledger
    gateway.TESSERA_CHAT_TEMPLATE_TOKENS = 0  # an estimate that misses the template: the allowance must hold
    with serving_gateway(gateway, metering_worker) as url:
        yield url


async def _race(url: str, secret: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=RACERS)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def one(i: int) -> httpx.Response:
            body = {"model": MODEL, "max_tokens": 40, "temperature": 0.8, "seed": i,
                    "messages": [{"role": "user", "content": f"Write about the number {i}."}]}
            return await client.post(f"{url}/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {secret}"})

        return await asyncio.gather(*(one(i) for i in range(RACERS)))


def _served(responses) -> tuple[list[dict], int]:
    ok = [r.json()["usage"] for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert all(r.status_code == 429 for r in refused), {r.status_code: r.text[:200] for r in refused}
    return ok, len(refused)


def _settled(tenant) -> None:
    wait_for(lambda: not InflightRequest.objects.filter(tenant_id=tenant.pk).exists(), timeout=60)


@pytest.mark.parametrize("limiter", ["database", "redis"])
def test_64_racers_never_exceed_a_hard_token_budget(real_gateway, tenant_key, limiter, request):
    if limiter == "redis":
        request.getfixturevalue("use_redis_limiter")
    budget = 1500
    tenant, secret = tenant_key.sync(monthly_token_budget=budget, budget_enforcement="hard")
    responses = asyncio.run(_race(real_gateway, secret))
    usages, refused = _served(responses)
    served = sum(u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    _settled(tenant)
    ledger = UsageRecord.objects.filter(tenant=tenant).aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    billed = (ledger["p"] or 0) + (ledger["c"] or 0)
    print(f"token budget, {limiter} limiter: {len(usages)} served, {refused} refused, {served}/{budget} tokens")
    assert len(usages) >= 5 and refused >= 1, (len(usages), refused)
    assert served <= budget, f"served {served} tokens against a hard budget of {budget}"
    assert billed == served  # every token the clients were told about is in the ledger, and nothing else
    tokens, _ = get_limiter().usage_sync(tenant_id=tenant.pk, period=period_start())
    assert tokens == served  # the limiter settled to exactly that


@pytest.mark.parametrize("limiter", ["database", "redis"])
def test_64_racers_never_exceed_a_hard_spend_budget(real_gateway, tenant_key, limiter, request):
    from billing.services.prices import price_create

    if limiter == "redis":
        request.getfixturevalue("use_redis_limiter")
    # $0.10 a prompt token, $0.20 a completion token: the budget holds ~20 requests' worth.
    price_create(model=MODEL, input_per_mtok=Decimal("100000"), cached_input_per_mtok=Decimal("100000"),
                 output_per_mtok=Decimal("200000"), effective_from=datetime.now(UTC) - timedelta(days=1))
    budget = Decimal("150")
    tenant, secret = tenant_key.sync(monthly_spend_budget=budget, budget_enforcement="hard")
    responses = asyncio.run(_race(real_gateway, secret))
    usages, refused = _served(responses)
    served = sum(Decimal("0.1") * u["prompt_tokens"] + Decimal("0.2") * u["completion_tokens"] for u in usages)
    _settled(tenant)
    billed = UsageRecord.objects.filter(tenant=tenant).aggregate(a=Sum("amount"))["a"] or Decimal(0)
    print(f"spend budget, {limiter} limiter: {len(usages)} served, {refused} refused, ${served}/${budget}")
    assert len(usages) >= 5 and refused >= 1, (len(usages), refused)
    assert served <= budget, f"served ${served} against a hard spend budget of ${budget}"
    assert billed == served
    _, spend_nano = get_limiter().usage_sync(tenant_id=tenant.pk, period=period_start())
    assert from_nano(spend_nano) == served


def test_a_stream_left_at_the_first_finish_reason_is_billed_every_generated_token(real_gateway, metering_worker,
                                                                                   tenant_key):
    """The issue's reproduction: n=2, ignore_eos and a long stop string that never matches, so the
    detokenizer holds a whole choice back and it arrives in one chunk. The client reads until the
    first finish_reason and leaves: counting SSE deltas billed a fraction of what it received. (The
    issue's 400-character stop string is now refused: stop strings are capped at 256 characters, which
    still hold back a whole 40-token choice.)"""
    tenant, secret = tenant_key.sync()
    body = {"model": MODEL, "n": 2, "temperature": 1, "max_tokens": 40, "ignore_eos": True, "stream": True,
            "stop": ["\u00a7" * 256], "messages": [{"role": "user", "content": "Tell me a story."}]}
    deltas = 0
    with httpx.Client(timeout=300) as client:
        with client.stream("POST", f"{real_gateway}/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {secret}"}) as response:
            assert response.status_code == 200, response.read()
            request_id = response.headers["x-request-id"]
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = httpx.Response(200, content=line[6:]).json()
                deltas += sum(1 for c in chunk["choices"] if c["delta"].get("content"))
                if any(c.get("finish_reason") for c in chunk["choices"]):
                    break
    _settled(tenant)
    record = UsageRecord.objects.get(request_id=request_id)
    reported = httpx.get(f"{metering_worker.url}/tessera/v1/requests/{request_id}/usage",
                         headers=metering_worker.headers, timeout=10).json()
    assert reported["state"] == "finished"
    assert record.completion_tokens == reported["completion_tokens"] >= 40  # one choice ran to its 40
    assert deltas <= 4 < record.completion_tokens  # the old delta count billed at most 4
    assert record.prompt_tokens == reported["prompt_tokens"] > 0 and record.status == "partial"


def test_a_prompt_the_estimate_undercounts_is_served_in_full_under_a_hard_budget(real_gateway, gateway, tenant_key):
    """SmolLM2 makes each digit a token: 300 digits are ~300 tokens where 3 bytes a token says 100. With
    the estimate as the worker's allowance the request was refused (400 token_allowance_exceeded); a
    hard budget reserves the prompt's upper bound instead (1 token a byte + the template's overhead)."""
    gateway.TESSERA_CHAT_TEMPLATE_TOKENS = 32  # the default: SmolLM2's template adds ~25
    tenant, secret = tenant_key.sync(monthly_token_budget=100_000, budget_enforcement="hard")
    body = {"model": MODEL, "max_tokens": 20, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Repeat these digits: " + "1234567890" * 30}]}
    response = httpx.post(f"{real_gateway}/v1/chat/completions", json=body, timeout=300,
                          headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 300 and usage["completion_tokens"] == 20  # not cut short
    assert response.json()["choices"][0]["finish_reason"] == "length"
    _settled(tenant)
