"""The usage journal: one row per admitted request whose usage is not yet in the ledger.

Written (durably) after a worker accepted the request and before the first byte goes to the client;
deleted in the same transaction that writes the request's ledger row. A row that outlives its
request means the gateway died (OOM, kill -9, a rollout past the grace period) before it could
account for it: the sweeper (sweeper.py) then asks the worker for the request's final counts,
writes the usage and settles the limiter. A row also outlives its ledger row when the request's
limiter settlement failed (`unsettled_*`), until the sweeper settles it. Plain ids, not foreign keys: the hot path inserts one
narrow row and nothing joins it.
"""

from __future__ import annotations

from django.db import models


class InflightRequest(models.Model):
    request_id = models.CharField(max_length=64, primary_key=True)  # the gateway's id: the ledger's key
    tenant_id = models.BigIntegerField()
    api_key_id = models.BigIntegerField(null=True)
    model = models.CharField(max_length=200)  # base model
    adapter = models.CharField(max_length=200, blank=True, default="")
    tier = models.CharField(max_length=64, blank=True, default="")
    prompt_estimate = models.PositiveIntegerField()  # the gateway's estimate, billed only as a last resort
    reserved_tokens = models.PositiveBigIntegerField()  # what the limiter reserved (the worker's allowance)
    reserved_spend_nano = models.BigIntegerField(default=0)
    period_start = models.DateField()  # the month the reservation was charged to
    worker_url = models.CharField(max_length=500)  # where to ask for the final counts
    created_at = models.DateTimeField()  # when the request arrived (prices in force then apply)
    batch_id = models.CharField(max_length=64, blank=True, default="")  # a batch line's: its own price line
    embeddings = models.BooleanField(default=False)  # a /v1/embeddings request: its own price line
    # A batch line's ledger identity (billing's UsageRecord.batch_line): a swept attempt of a line that was
    # sent again meanwhile is still billed once.
    batch_line = models.CharField(max_length=80, blank=True, default="")
    admitted_at = models.DateTimeField(auto_now_add=True)
    # The request's final counts, set when its limiter settlement failed (Redis did not answer): the row
    # then outlives the ledger write, and the sweeper settles (and, idempotently, bills) these counts.
    unsettled_prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    unsettled_cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    unsettled_completion_tokens = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["admitted_at"], name="gateway_inflight_admitted")]

    def __str__(self) -> str:
        return self.request_id


class StoredResponse(models.Model):
    """A Responses API answer kept (`store: true`) so that `previous_response_id` continues from it and
    GET /v1/responses/{id} returns it. `context` is everything the model saw, less `instructions` (which
    OpenAI does not carry over), plus what it answered: one read rebuilds the conversation, and deleting
    an earlier response does not break the ones that continued it. Kept TESSERA_RESPONSES_RETENTION_DAYS."""

    id = models.CharField(max_length=64, primary_key=True)  # resp_<hex of the gateway's request id>
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="stored_responses")
    body = models.JSONField()  # the Response object as the client received it
    context = models.JSONField()  # input items (earlier turns included) + output items
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["created_at"], name="gateway_response_created")]

    def __str__(self) -> str:
        return self.id
