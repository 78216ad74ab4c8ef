"""From a presented `sk-...` secret to a `KeyPrincipal`: who is calling and what they may do.

The gateway calls this on every request, so a lookup is cached per process for
TESSERA_AUTH_CACHE_SECONDS (services clear the local cache on every change; other processes
see a revocation, suspension or tier change within that many seconds).

While the database does not answer, the gateway may serve a key it looked up successfully within
the last TESSERA_AUTH_STALE_SECONDS (`last_known`): a short database outage (a failover, a restart)
then costs no refused requests for keys in use. A key first seen during the outage, or revoked in
another process during it, is decided when the database is back (the revocation is honoured then).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from common.errors import ApplicationError

from .keys import hash_secret, looks_like_key
from .models import APIKey, TenantStatus
from .selectors import TenantLimits, tenant_limits


@dataclass(frozen=True, slots=True)
class KeyPrincipal:
    key_id: int
    key_prefix: str
    key_name: str
    tenant_id: int
    tenant_slug: str
    tenant_active: bool
    cache_salt: str
    limits: TenantLimits
    allowed_models: frozenset[str]  # empty = any
    allowed_adapters: frozenset[str]  # empty = any
    expires_at: float | None  # epoch seconds
    revoked: bool
    can_manage: bool
    log_content_sample_rate: float = 0.0  # operator opt-in to log prompt/completion text (0 = never)

    def may_use(self, base: str, adapter: str | None = None) -> bool:
        """Scopes: allowed_models names base models (or an adapter's own id); allowed_adapters
        restricts adapters. An empty scope allows everything."""
        models_ok = (
            not self.allowed_models
            or base in self.allowed_models
            or (adapter is not None and adapter in self.allowed_models)
        )
        adapter_ok = adapter is None or not self.allowed_adapters or adapter in self.allowed_adapters
        return models_ok and adapter_ok


def invalid_key(message: str = "Incorrect API key provided.") -> ApplicationError:
    return ApplicationError(
        message, code="invalid_api_key", status=401, headers={"WWW-Authenticate": 'Bearer realm="tessera"'}
    )


def tenant_suspended() -> ApplicationError:
    return ApplicationError(
        "This tenant is suspended. Contact your operator.", code="tenant_suspended", status=403
    )


def bearer_secret(header: str | None) -> str:
    if not header:
        raise invalid_key("You didn't provide an API key. Send it as 'Authorization: Bearer sk-...'.")
    scheme, _, secret = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise invalid_key("Malformed Authorization header; expected 'Bearer sk-...'.")
    return secret.strip()


_cache: dict[str, tuple[float, KeyPrincipal | None]] = {}
_last_known: dict[str, tuple[float, KeyPrincipal | None]] = {}  # hash -> (monotonic fetch time, principal)
_cache_lock = threading.Lock()
_CACHE_MAX = 100_000


def cache_clear() -> None:
    with _cache_lock:
        _cache.clear()
        _last_known.clear()


def _load(key_hash: str) -> KeyPrincipal | None:
    try:
        key = APIKey.objects.select_related("tenant", "tenant__tier").get(key_hash=key_hash)
    except APIKey.DoesNotExist:
        return None
    tenant = key.tenant
    return KeyPrincipal(
        key_id=key.pk,
        key_prefix=key.prefix,
        key_name=key.name,
        tenant_id=tenant.pk,
        tenant_slug=tenant.slug,
        tenant_active=tenant.status == TenantStatus.ACTIVE,
        cache_salt=tenant.cache_salt,
        limits=tenant_limits(tenant=tenant),
        allowed_models=frozenset(key.allowed_models or ()),
        allowed_adapters=frozenset(key.allowed_adapters or ()),
        expires_at=key.expires_at.timestamp() if key.expires_at else None,
        revoked=key.revoked,
        can_manage=key.can_manage,
        log_content_sample_rate=tenant.log_content_sample_rate,
    )


def cached_lookup(secret: str) -> tuple[bool, KeyPrincipal | None]:
    """(hit, principal) from the process cache without touching the database."""
    return cached_lookup_hash(hash_secret(secret))


def cached_lookup_hash(key_hash: str) -> tuple[bool, KeyPrincipal | None]:
    """`cached_lookup` for a key known by its stored hash (a batch's runner holds no secret)."""
    ttl = settings.TESSERA_AUTH_CACHE_SECONDS
    if ttl <= 0:
        return False, None
    entry = _cache.get(key_hash)
    if entry is None or entry[0] < time.monotonic():
        return False, None
    return True, entry[1]


def lookup(secret: str) -> KeyPrincipal | None:
    """Database lookup (sync), filling the cache; None when no key has this secret."""
    return lookup_hash(hash_secret(secret))


def lookup_hash(key_hash: str) -> KeyPrincipal | None:
    """`lookup` for a key known by its stored hash."""
    principal = _load(key_hash)
    ttl = settings.TESSERA_AUTH_CACHE_SECONDS
    now = time.monotonic()
    with _cache_lock:
        if ttl > 0:
            if len(_cache) >= _CACHE_MAX:
                _cache.clear()
            _cache[key_hash] = (now + ttl, principal)
        if settings.TESSERA_AUTH_STALE_SECONDS > 0:
            if len(_last_known) >= _CACHE_MAX:
                _last_known.clear()
            _last_known[key_hash] = (now, principal)
    return principal


def last_known(secret: str) -> tuple[bool, KeyPrincipal | None]:
    """(hit, principal) as the database said within TESSERA_AUTH_STALE_SECONDS: for a gateway whose
    database does not answer right now. A miss means the caller must refuse (503)."""
    return last_known_hash(hash_secret(secret))


def last_known_hash(key_hash: str) -> tuple[bool, KeyPrincipal | None]:
    """`last_known` for a key known by its stored hash."""
    entry = _last_known.get(key_hash)
    if entry is None or time.monotonic() - entry[0] > settings.TESSERA_AUTH_STALE_SECONDS:
        return False, None
    return True, entry[1]


def check(principal: KeyPrincipal | None, *, now: float | None = None) -> KeyPrincipal:
    """Refuse missing, revoked and expired keys and suspended tenants."""
    if principal is None or principal.revoked:
        raise invalid_key()
    now = time.time() if now is None else now
    if principal.expires_at is not None and principal.expires_at <= now:
        raise invalid_key("This API key has expired.")
    if not principal.tenant_active:
        raise tenant_suspended()
    return principal


def authenticate(secret: str) -> KeyPrincipal:
    """Sync: for the management API and the CLI."""
    if not looks_like_key(secret):
        raise invalid_key()
    hit, principal = cached_lookup(secret)
    if not hit:
        principal = lookup(secret)
    return check(principal, now=timezone.now().timestamp())
