"""The batch's key as the gateway sees it now, checked before each line is sent.

A batch runs for up to 24 h as the key that created it. What that key may do is read the way the
gateway reads it for an online request: the process's key cache (tenants/auth.py), which every
change to a key, tenant or tier clears on commit in the process that made it, and which other
processes refresh after TESSERA_AUTH_CACHE_SECONDS. So a revoked or expired key, a suspended tenant,
a lower tier or budget reaches a running batch as fast as it reaches the gateway, for a dictionary
lookup per line and at most one query per cache period. While the database does not answer, the key
as it last said (within TESSERA_AUTH_STALE_SECONDS), as the gateway does.
"""

from __future__ import annotations

import dataclasses

from controlplane.gateway.proxy import principal_for_hash
from tenants import auth
from tenants.auth import KeyPrincipal
from tenants.models import APIKey

from . import conf


def key_hash_of(api_key_id: int | None) -> str | None:
    if api_key_id is None:  # the key was deleted
        return None
    return APIKey.objects.filter(pk=api_key_id).values_list("key_hash", flat=True).first()


async def current(key_hash: str | None) -> KeyPrincipal:
    """The key's principal, at batch priority; the ApplicationError an online request of this key
    would get now (`invalid_api_key`, `tenant_suspended`) when it may not send."""
    if key_hash is None:
        raise auth.invalid_key()
    principal = await principal_for_hash(key_hash)
    limits = dataclasses.replace(principal.limits, priority=conf.batch_priority())
    return dataclasses.replace(principal, limits=limits)
