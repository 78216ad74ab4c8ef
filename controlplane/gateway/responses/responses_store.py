"""Stored Responses API answers, per tenant: the reads always take the tenant, so another tenant's id
is simply not there (404, never 403). A response older than TESSERA_RESPONSES_RETENTION_DAYS is gone
for reads at once and deleted by the prune task (beat) or `manage.py responses_prune`."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.utils import timezone

from controlplane.gateway.models import StoredResponse

PRUNE_BATCH = 1000  # rows per delete, so a large backlog never holds one long transaction


def retention_cutoff(now: dt.datetime | None = None) -> dt.datetime:
    return (now or timezone.now()) - dt.timedelta(days=settings.TESSERA_RESPONSES_RETENTION_DAYS)


def stored_response_get(*, tenant_id: int, response_id: str) -> StoredResponse | None:
    return StoredResponse.objects.filter(tenant_id=tenant_id, id=response_id,
                                         created_at__gte=retention_cutoff()).first()


def stored_response_create(*, tenant_id: int, response_id: str, body: dict[str, Any],
                           context: list[dict[str, Any]]) -> StoredResponse:
    return StoredResponse.objects.create(id=response_id, tenant_id=tenant_id, body=body, context=context,
                                         created_at=dt.datetime.fromtimestamp(body["created_at"], dt.UTC))


def stored_response_delete(*, tenant_id: int, response_id: str) -> bool:
    deleted, _ = StoredResponse.objects.filter(tenant_id=tenant_id, id=response_id,
                                               created_at__gte=retention_cutoff()).delete()
    return deleted > 0


def stored_responses_prune(*, now: dt.datetime | None = None) -> int:
    """Delete every response past retention; returns how many."""
    cutoff, total = retention_cutoff(now), 0
    while True:
        ids = list(StoredResponse.objects.filter(created_at__lt=cutoff).values_list("id", flat=True)[:PRUNE_BATCH])
        if not ids:
            return total
        deleted, _ = StoredResponse.objects.filter(id__in=ids).delete()
        total += deleted
