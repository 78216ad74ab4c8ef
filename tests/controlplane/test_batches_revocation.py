"""A running batch meets its key's changes as an online request does: revoking or expiring the key,
suspending the tenant, lowering its budget or its tier stops the lines not yet sent, each failed
with the error a direct request of that key would get now; the lines in flight finish."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
import time

import openai
import pytest
from django.utils import timezone

from .test_batches_api import _jsonl, _line, _run

pytestmark = pytest.mark.django_db(transaction=True)

LINES = 12


@pytest.fixture
def client_for(live_gateway, tenant_key, settings, tmp_path):
    settings.TESSERA_FILES_DIR = str(tmp_path / "files")

    def make(**tier_fields):
        tier_fields.setdefault("requests_per_minute", 10_000)
        tenant, secret = tenant_key.sync(**tier_fields)
        return tenant, openai.OpenAI(base_url=f"{live_gateway}/v1", api_key=secret, max_retries=0, timeout=30)

    return make


def _revoke(tenant) -> None:
    from tenants import services
    from tenants.models import APIKey

    services.api_key_revoke(tenant=tenant, key=APIKey.objects.get(tenant=tenant))


def _expire(tenant) -> None:
    from tenants.models import APIKey

    APIKey.objects.filter(tenant=tenant).update(expires_at=timezone.now() - dt.timedelta(seconds=1))


def _suspend(tenant) -> None:
    from tenants import services

    services.tenant_suspend(tenant=tenant)


def _lower_budget(tenant) -> None:
    from tenants import services

    services.tier_update(tier=tenant.tier, monthly_token_budget=1, budget_enforcement="hard")


def _lower_tier(tenant) -> None:
    from tenants import services

    small = services.tier_create(name=f"small-{tenant.pk}", priority=9, requests_per_minute=10_000,
                                 monthly_token_budget=1, budget_enforcement="hard")
    services.tenant_update(tenant=tenant, tier=small)


@pytest.mark.parametrize(("change", "code", "status"), [
    (_revoke, "invalid_api_key", 401),
    (_expire, "invalid_api_key", 401),
    (_suspend, "tenant_suspended", 403),
    (_lower_budget, "insufficient_quota", 429),
    (_lower_tier, "insufficient_quota", 429),
], ids=["revoked", "expired", "suspended", "budget-lowered", "tier-lowered"])
def test_a_change_to_the_key_stops_its_running_batch(client_for, workers, settings, change, code, status):
    from controlplane.batches.models import BatchLine

    settings.TESSERA_BATCH_CONCURRENCY = 1
    for worker in workers:
        worker.token_delay = 0.05  # 4 tokens: 0.2 s a line
    tenant, client = client_for()
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line(f"r{i}") for i in range(LINES)]))),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(status=_run(batch.id)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while BatchLine.objects.filter(batch_id=batch.id, state="succeeded").count() < 2:
        assert time.monotonic() < deadline and runner.is_alive(), "the batch did not start"
        time.sleep(0.02)
    tenant.refresh_from_db()
    change(tenant)
    runner.join(60)
    assert outcome.get("status") == "completed"

    states = dict(BatchLine.objects.filter(batch_id=batch.id).values_list("custom_id", "state"))
    answered = [cid for cid, state in states.items() if state == "succeeded"]
    failed = BatchLine.objects.filter(batch_id=batch.id, state="failed")
    assert 2 <= len(answered) <= 3, states  # those answered before, and the one in flight at the change
    assert failed.count() == LINES - len(answered)
    assert {(line.status_code, line.error["code"], line.response["error"]["code"]) for line in failed} == {
        (status, code, code)}
    sent = [r for w in workers for r in w.received if r.path.endswith("/chat/completions")]
    assert len(sent) == len(answered)  # nothing more reached a worker
    from controlplane.batches.files import file_content
    from controlplane.batches.models import Batch

    # Read as the operator: a revoked key or a suspended tenant cannot read it through the API any more.
    _, data = file_content(tenant_id=tenant.pk, file_id=Batch.objects.get(pk=batch.id).error_file_id)
    assert {json.loads(x)["error"]["code"] for x in data.splitlines()} == {code}


def test_a_line_in_flight_at_the_revocation_is_not_tried_again_after_it(client_for, workers, settings):
    """The lines out when the key is revoked come back with a 5xx (tried again, normally): they fail
    with the key's error, instead of staying pending with no answer."""
    from controlplane.batches.models import BatchLine

    settings.TESSERA_BATCH_CONCURRENCY = 3  # both lines out, and room for more: the key is checked meanwhile
    hold = threading.Event()
    for worker in workers:
        worker.hold = hold
    tenant, client = client_for()
    source = client.files.create(file=("in.jsonl", io.BytesIO(_jsonl([_line(f"f{i}") for i in range(2)]))),
                                 purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(status=_run(batch.id)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while len([r for w in workers for r in w.received]) < 2:
        assert time.monotonic() < deadline and runner.is_alive(), "the lines were not sent"
        time.sleep(0.02)
    _revoke(tenant)
    time.sleep(0.5)  # the runner notices (it looks every 0.1 s while there is room)
    for worker in workers:
        worker.fail_status = 500
    hold.set()
    runner.join(60)
    assert outcome.get("status") == "completed"
    lines = BatchLine.objects.filter(batch_id=batch.id)
    assert {(line.state, line.error["code"]) for line in lines} == {("failed", "invalid_api_key")}
    assert len([r for w in workers for r in w.received]) == 2
