"""The gateway with billing's real ledger as its sink: one ledger row per request, whatever retries."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

pytestmark = pytest.mark.django_db(transaction=True)


async def test_each_request_lands_once_in_the_ledger(gateway, tenant_key, drain):
    from billing.models import UsageRecord
    from billing.services.usage import usage_record_ingest
    from common.asyncdb import db_call
    from controlplane.gateway.usage import usage_writer

    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"
    tenant, secret = await tenant_key()
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    response = await AsyncClient().post("/v1/chat/completions", data=json.dumps(body), content_type="application/json",
                                        headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200
    await drain()
    request_id = response["x-request-id"]
    record = await UsageRecord.objects.aget(request_id=request_id)
    assert (record.tenant_id, record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (tenant.pk, 7, 3, 3)

    # A retried delivery of the same event (e.g. the writer's per-event retry) is a no-op.
    from billing.events import UsageEvent

    event = UsageEvent(request_id, tenant.pk, record.api_key_id, "fake-model", None, record.tier, 7, 3, 3, None, 1.0,
                       "ok", record.created_at)
    await db_call(usage_record_ingest, event=event)
    await usage_writer.writer_for(usage_record_ingest).submit(event)
    assert await UsageRecord.objects.filter(request_id=request_id).acount() == 1


async def test_a_hard_spend_budget_priced_by_the_price_book(gateway, tenant_key, drain):
    from datetime import UTC, datetime, timedelta
    from decimal import Decimal

    from billing.services.prices import price_create
    from common.asyncdb import db_call

    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"
    await db_call(price_create, model="fake-model", input_per_mtok=Decimal("0"), cached_input_per_mtok=Decimal("0"),
                  output_per_mtok=Decimal("100000"), effective_from=datetime.now(UTC) - timedelta(days=1))
    _, secret = await tenant_key(monthly_spend_budget=Decimal("1.00"), budget_enforcement="hard")
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}  # $0.30 each
    statuses = []
    for _ in range(4):
        response = await AsyncClient().post("/v1/chat/completions", data=json.dumps(body),
                                            content_type="application/json", headers={"Authorization": f"Bearer {secret}"})
        statuses.append(response.status_code)
        await drain()
    assert statuses == [200, 200, 200, 429]
    assert response.json()["error"]["code"] == "insufficient_quota"
