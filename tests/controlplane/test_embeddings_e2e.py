"""Embeddings end to end: the official `openai` client → the gateway (uvicorn, auth, limits, the real
ledger) → a real SmolLM2-135M worker in float32, checked against transformers' final hidden states
(last-token pooling, L2-normalized) on the same GGUF, and billed once on the embeddings price line;
also as a `/v1/embeddings` batch (controlplane/batches), billed once per line at the batch share."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import openai
import orjson
import pytest
import torch

from billing.models import UsageRecord
from controlplane.gateway.models import InflightRequest
from tests.dataplane.worker.process import MODEL, running

from .conftest import serving_gateway
from .test_live_gateway import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.django_db(transaction=True)]

TEXTS = ["The capital of France is Paris.", "Tessera serves language models to many tenants at once.", "hi"]
RATE = Decimal("0.02")


@pytest.fixture(scope="module")
def real_worker():
    with running("--dtype", "float32", "--max-embedding-inputs", "8") as worker:
        yield worker


@pytest.fixture(scope="module")
def reference():
    """(the worker's tokenizer, ids -> the offline engine's embedding, one prompt at a time). The pooling
    itself is checked against transformers in tests/dataplane/test_embeddings.py; here the chain
    (client, gateway, worker, batching with other inputs) must hand back what the engine computes."""
    from dataplane import LLM

    llm = LLM(MODEL, dtype="float32", kv_cache_memory="32MiB", enable_prefix_caching=False)
    return llm.tokenizer, lambda ids: torch.tensor(llm.embed([ids])[0])


@pytest.fixture
def served(real_worker, gateway, tenant_key):
    from billing.services.prices import price_create

    gateway.TESSERA_USAGE_SINK = "billing.services.usage_record_ingest"  # the real ledger
    price_create(model=MODEL, input_per_mtok=Decimal("0.15"), cached_input_per_mtok=Decimal("0.075"),
                 output_per_mtok=Decimal("0.60"), embedding_input_per_mtok=RATE,
                 effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    with serving_gateway(gateway, real_worker) as url:
        tenant, secret = tenant_key.sync(requests_per_minute=1000)
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=120), tenant


def test_openai_client_embeddings_match_the_engine_and_bill_once(served, reference):
    client, tenant = served
    tok, embed = reference
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=TEXTS)  # the client asks for base64
    packed = raw.parse()
    plain = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float", user="someone")
    ids = [tok.encode(t) for t in TEXTS]
    assert packed.usage.prompt_tokens == packed.usage.total_tokens == sum(map(len, ids))
    assert [d.index for d in packed.data] == [0, 1, 2] and packed.model == MODEL
    for want_ids, a, b in zip(ids, packed.data, plain.data, strict=True):
        want = embed(want_ids)
        assert len(a.embedding) == want.numel() == 576
        torch.testing.assert_close(torch.tensor(a.embedding), want, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(b.embedding), torch.tensor(a.embedding), atol=1e-5, rtol=1e-4)

    wait_for(lambda: not InflightRequest.objects.filter(tenant_id=tenant.pk).exists(), timeout=30)
    records = list(UsageRecord.objects.filter(request_id=raw.headers["x-request-id"]))
    assert len(records) == 1  # billed exactly once
    record = records[0]
    assert record.embeddings and record.completion_tokens == 0 and record.status == "ok"
    assert record.prompt_tokens == packed.usage.prompt_tokens
    assert record.amount == record.prompt_tokens * RATE / 10**6
    assert UsageRecord.objects.filter(tenant=tenant).count() == 2  # the float request: its own single row


def test_openai_client_sees_400s_in_openai_shape(served):
    client, _ = served
    cases = [({"input": ""}, "input"), ({"input": "x", "dimensions": 64}, "dimensions"),
             ({"input": ["x"] * 9}, "input"), ({"input": "word " * 9000}, "input")]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as exc:
            client.embeddings.create(model=MODEL, **kwargs)
        assert exc.value.body["param"] == param, exc.value.body
    assert client.embeddings.create(model=MODEL, input="x", dimensions=576).data[0].embedding


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def _embedding_line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, **body}}


def test_embeddings_batch_answers_each_line_once_at_the_batch_rate(served, reference, gateway, tmp_path, real_worker):
    """A `/v1/embeddings` batch through the real runner: each output line's body is the embeddings
    response (vectors the engine computes), a bad line lands in the error file, and the ledger holds one
    row per answered line at the embeddings rate x the batch share, even for a line a dead runner had
    already sent and billed (re-sent under the same request id: the ledger's first write stands)."""
    from asgiref.sync import async_to_sync

    from controlplane.batches import lines as batch_lines
    from controlplane.batches.models import Batch
    from controlplane.batches.runner import run

    client, tenant = served
    tok, embed = reference
    gateway.TESSERA_FILES_DIR = str(tmp_path / "files")
    inputs = {"e0": TEXTS[0], "e1": TEXTS[1:], "e2": "Embeddings in a batch."}
    lines = [_embedding_line(cid, input=value) for cid, value in inputs.items()]
    lines.append(_embedding_line("bad", input="x", dimensions=64))  # refused by the worker: the error file
    source = client.files.create(file=("embed.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/embeddings", completion_window="24h")

    # A runner that died after its first line was served and billed, before the line said answered.
    from controlplane.batches.services import batch_validate

    before = real_worker.metrics()

    batch_validate(batch_id=batch.id)
    (dead,) = batch_lines.line_claim(batch_id=batch.id, limit=1)
    async_to_sync(_send_as_dead_runner)(batch.id, dead)
    assert UsageRecord.objects.filter(request_id=dead.request_id).count() == 1
    Batch.objects.filter(pk=batch.id).update(lease_until=None)  # its lease passed

    assert async_to_sync(run)(batch.id) == "completed"
    done = client.batches.retrieve(batch.id)
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 3, 1)
    output = {o["custom_id"]: o for o in map(orjson.loads, client.files.content(done.output_file_id).read()
                                              .splitlines())}
    assert set(output) == {"e0", "e1", "e2"} and output["e0"]["response"]["request_id"] == dead.request_id
    for cid, value in inputs.items():
        record = output[cid]
        assert record["error"] is None and record["response"]["status_code"] == 200
        body = record["response"]["body"]
        texts = value if isinstance(value, list) else [value]
        ids = [tok.encode(t) for t in texts]
        assert body["object"] == "list" and body["model"] == MODEL
        assert body["usage"] == {"prompt_tokens": sum(map(len, ids)), "total_tokens": sum(map(len, ids))}
        assert [d["index"] for d in body["data"]] == list(range(len(texts)))
        for want_ids, item in zip(ids, body["data"], strict=True):
            torch.testing.assert_close(torch.tensor(item["embedding"]), embed(want_ids), atol=1e-5, rtol=1e-4)
    (error,) = map(orjson.loads, client.files.content(done.error_file_id).read().splitlines())
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "dimensions"

    billed = {r.request_id: r for r in UsageRecord.objects.filter(batch_id=batch.id, prompt_tokens__gt=0)}
    assert set(billed) == {o["response"]["request_id"] for o in output.values()}  # one row per answered line
    for o in output.values():
        record = billed[o["response"]["request_id"]]
        assert record.embeddings and record.completion_tokens == 0
        assert record.prompt_tokens == o["response"]["body"]["usage"]["prompt_tokens"]
        assert record.amount == record.prompt_tokens * RATE / 2 / 10**6  # the default batch share: half
    # The worker computed the dead runner's line twice (it cannot know), and says so in its metrics.
    after = real_worker.metrics()
    served_tokens = sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in output.values())

    def delta(name: str, **labels: str) -> float:
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted({"model_name": MODEL, **labels}.items())) + "}"
        return after.get(key, 0) - before.get(key, 0)

    assert delta("tessera:embedding_requests_total", status="ok") == 4
    assert delta("tessera:embedding_requests_total", status="rejected") == 1
    assert delta("tessera:embedding_prompt_tokens_total") == served_tokens + billed[dead.request_id].prompt_tokens
    assert delta("tessera:embedding_request_duration_seconds_count", priority="other") == 4  # batch lines: 1000
    assert async_to_sync(run)(batch.id) == "completed"  # a finished batch run again bills nothing more
    assert UsageRecord.objects.filter(batch_id=batch.id, prompt_tokens__gt=0).count() == 3


async def _send_as_dead_runner(batch_id: str, line) -> None:
    """What a runner does for a line up to the moment it would mark it answered."""
    from django.http import HttpRequest

    from common.asyncdb import db_call
    from controlplane.batches import principal as batch_principal
    from controlplane.batches.lines import line_ledger_key
    from controlplane.batches.models import Batch
    from controlplane.gateway import proxy
    from controlplane.gateway.usage import accounting

    batch = await db_call(Batch.objects.get, pk=batch_id)
    principal = await batch_principal.current(await db_call(batch_principal.key_hash_of, batch.api_key_id))
    response = await proxy.handle(HttpRequest(), "embeddings", body=orjson.dumps(line.body), principal=principal,
                                  request_id=line.request_id, batch_id=batch_id,
                                  batch_line=line_ledger_key(batch_id=batch_id, custom_id=line.custom_id))
    assert response.status_code == 200, response.content
    await accounting.accounted(line.request_id)
    await accounting.drain()

