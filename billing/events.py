"""The usage event: what the gateway knows about one finished request, handed to billing.

A plain dataclass so the gateway (producer) and the ledger (consumer) agree on one shape.
`request_id` is the idempotency key: ingesting the same event twice bills once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class UsageEvent:
    request_id: str  # gateway-assigned, unique per client request; the ledger's idempotency key
    tenant_id: int  # tenants.Tenant primary key
    api_key_id: int | None  # tenants.APIKey primary key (None for operator/internal calls)
    model: str  # base model name as served
    adapter: str | None  # adapter name, None for the base model
    tier: str  # tier name at request time
    prompt_tokens: int  # all prompt tokens, cached included
    cached_tokens: int  # prompt tokens served from the prefix cache
    completion_tokens: int  # tokens actually delivered to the client
    ttft_ms: float | None  # time to first token, None when no token was produced
    latency_ms: float  # end-to-end latency seen by the gateway
    status: str  # "ok" | "partial" (client disconnected) | "error"
    created_at: datetime  # when the request started (prices in force at this instant apply)
    # Reliability signals for the SLOs (controlplane/slo), not billed. Defaults keep old events valid.
    http_status: int | None = None  # status the client got (499 = client left; in-band stream error = 500)
    itl_ms: float | None = None  # mean inter-token latency of the stream, None unless >= 2 tokens streamed
    batch_id: str | None = None  # the batch (/v1/batches) a line belongs to: priced on the batch price line
    embeddings: bool = False  # a /v1/embeddings request: input tokens priced on the embeddings price line
    # The batch line (its batch and custom_id, controlplane/batches/lines.py `line_ledger_key`) this request
    # is an attempt of: the ledger bills a line once whichever attempt, and under whichever request id, it
    # was served. None for everything that is not a batch line.
    batch_line: str | None = None
    # The worker the request was sent to (its URL): the replica whose hour its cost is a share of.
    worker_url: str = ""
