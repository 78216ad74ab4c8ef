"""Embeddings end to end: the official `openai` client → the gateway (uvicorn, auth, limits, the real
ledger) → a real SmolLM2-135M worker in float32, checked against transformers' final hidden states
(last-token pooling, L2-normalized) on the same GGUF, and billed once on the embeddings price line."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import openai
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
