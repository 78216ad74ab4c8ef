"""Celery tasks of the gateway: the usage sweeper (beat, every minute), the stored-responses prune (hourly)."""

from __future__ import annotations

import asyncio

from celery import shared_task
from django.db import DatabaseError

from controlplane.gateway import upstream
from controlplane.gateway.responses.responses_store import stored_responses_prune
from controlplane.gateway.usage import sweeper


async def _sweep_once() -> dict[str, int]:
    try:
        return (await sweeper.sweep()).as_dict()
    finally:
        await upstream.close()  # this loop's worker connections: asyncio.run closes the loop next


@shared_task(name="gateway.usage_sweep", acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=True,
             retry_backoff_max=300, max_retries=5)
def usage_sweep() -> dict[str, int]:
    """Idempotent: every row it finishes is billed once whatever else runs at the same time."""
    return asyncio.run(_sweep_once())


@shared_task(name="gateway.responses_prune", acks_late=True, autoretry_for=(DatabaseError,), retry_backoff=True,
             retry_backoff_max=300, max_retries=5)
def responses_prune() -> int:
    """Stored Responses API answers past retention (reads already skip them; this frees the rows)."""
    return stored_responses_prune()
