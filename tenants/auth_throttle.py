"""Failed API-key authentications throttled per client address, on /v1 (the gateway) and /api/v1 (DRF).

- Only failures count. A 401 (no key; a malformed, unknown, revoked or expired key) is one failure of
  its address in the shared store (tenants/limits/auth_failures.py: Redis or the database, like the
  tenants' limits). Past TESSERA_AUTH_FAILURES_PER_MINUTE in a burst, the answer is 429
  `too_many_failed_auth` with Retry-After instead of 401.
- A request with a valid key pays nothing: it is neither counted nor checked against the store (no
  round trip). This process only remembers, in memory, that this key proved itself from this address.
- Once the store has refused a failure from an address, this process refuses that address at once
  until the Retry-After has passed: no key lookup, no store call, so a flood of bad keys costs
  neither the database nor the store, and a guess made meanwhile learns nothing about its key. A
  key that already authenticated from that address in this process (within PROOF_SECONDS) is still
  looked up and served: a good client behind the same NAT as the attacker keeps working. A key new to
  the address waits out the Retry-After (seconds: the bucket refills continuously).
- The store unreachable: the failure is not counted and its 401 stands (the throttle fails open;
  logged at most once a minute). Valid keys never reach the store, so they never notice.
- IPv6 clients are counted per /64: one host commonly holds a whole /64 and could otherwise rotate
  through its addresses.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from prometheus_client import Counter

from common.errors import ApplicationError
from controlplane.slo.metrics import REGISTRY

from . import auth
from .keys import hash_secret
from .limits.auth_failures import Verdict, get_store, per_minute

log = logging.getLogger("tessera.auth")

P = TypeVar("P")

PROOF_SECONDS = 3600.0  # how long a key that authenticated from an address is let through that address's refusal
_MEMO_MAX = 100_000  # entries per memo before it is emptied (an attacker cannot grow memory without bound)
_OUTAGE_LOG_SECONDS = 60.0

_blocked: dict[str, float] = {}  # address -> monotonic time the refusal ends
_proved: dict[tuple[str, str], float] = {}  # (address, key hash) -> monotonic time the proof lapses
_lock = threading.Lock()
_last_outage_log = [0.0]

# Per process, like the gateway's counters (sum over processes in Prometheus).
FAILURES = Counter("tessera_auth_key_failures", "Failed API-key authentications by door (v1, api) and outcome "
                   "(counted: a 401 counted against its address; refused: a 429 too_many_failed_auth; uncounted: "
                   "a 401 the store could not count)", ["door", "outcome"], registry=REGISTRY)


@functools.lru_cache(maxsize=4096)  # on every /v1 request, twice: ipaddress parsing is not cheap
def address_key(address: str | None) -> str:
    """What failures are counted under: the IPv4 address, or the IPv6 address's /64."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address[:64] if address else "unknown"
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def clear() -> None:
    """Forget every refusal and proof of this process (tests)."""
    with _lock:
        _blocked.clear()
        _proved.clear()


def too_many(retry_after: float) -> ApplicationError:
    retry = max(retry_after, 0.001)
    return ApplicationError(
        f"Too many failed authentication attempts from your address. Please try again in {math.ceil(retry)}s.",
        code="too_many_failed_auth", status=429, type="requests",
        headers={"Retry-After": str(max(1, math.ceil(retry))), "retry-after-ms": str(math.ceil(retry * 1000))},
    )


def _fingerprint(authorization: str | None) -> str | None:
    try:
        return hash_secret(auth.bearer_secret(authorization))
    except ApplicationError:
        return None


def _remember(memo: dict, key, until: float) -> None:
    if len(memo) >= _MEMO_MAX:
        with _lock:
            if len(memo) >= _MEMO_MAX:
                memo.clear()
    memo[key] = until


def _refuse_if_blocked(address: str, authorization: str | None, door: str) -> None:
    until = _blocked.get(address)
    if until is None:
        return
    now = time.monotonic()
    if until <= now:
        _blocked.pop(address, None)
        return
    fingerprint = _fingerprint(authorization)
    if fingerprint is not None and _proved.get((address, fingerprint), 0.0) > now:
        return  # this key has authenticated from here before: look it up as usual
    FAILURES.labels(door, "refused").inc()
    raise too_many(until - now)


def _prove(address: str, authorization: str | None) -> None:
    fingerprint = _fingerprint(authorization)
    if fingerprint is not None:
        _remember(_proved, (address, fingerprint), time.monotonic() + PROOF_SECONDS)


def _after_count(address: str, verdict: Verdict | None, failure: ApplicationError, door: str) -> ApplicationError:
    """The error to answer after a failure was counted: the 401 itself, or a 429 once over the limit."""
    if verdict is None or verdict.allowed:
        FAILURES.labels(door, "uncounted" if verdict is None else "counted").inc()
        return failure
    FAILURES.labels(door, "refused").inc()
    first = address not in _blocked
    _remember(_blocked, address, time.monotonic() + verdict.retry_after)
    if first:
        log.warning("failed API-key authentications throttled", extra={"client": address,
                                                                        "retry_after": verdict.retry_after})
    return too_many(verdict.retry_after)


def _store_down(exc: BaseException) -> None:
    now = time.monotonic()
    if now - _last_outage_log[0] >= _OUTAGE_LOG_SECONDS:
        _last_outage_log[0] = now
        log.warning("failed-authentication store unreachable; not counting failures (fail open)",
                    extra={"error": repr(exc)[:300]})


async def guarded(address: str | None, authorization: str | None,
                  authenticate: Callable[..., Awaitable[P]], **kwargs) -> P:
    """`await authenticate(authorization, **kwargs)` under the throttle (the gateway)."""
    limit = per_minute()
    if limit <= 0:
        return await authenticate(authorization, **kwargs)
    key = address_key(address)
    _refuse_if_blocked(key, authorization, "v1")
    try:
        principal = await authenticate(authorization, **kwargs)
    except ApplicationError as failure:
        if failure.status != 401:
            raise
        try:
            verdict = await get_store().fail(key, limit)
        except Exception as exc:  # noqa: BLE001  (any store failure: fail open)
            _store_down(exc)
            verdict = None
        raise _after_count(key, verdict, failure, "v1") from None
    if principal is not None:
        _prove(key, authorization)
    return principal


def guarded_sync(address: str | None, authorization: str | None, authenticate: Callable[[str | None], P]) -> P:
    """`authenticate(authorization)` under the throttle (the management API)."""
    limit = per_minute()
    if limit <= 0:
        return authenticate(authorization)
    key = address_key(address)
    _refuse_if_blocked(key, authorization, "api")
    try:
        principal = authenticate(authorization)
    except ApplicationError as failure:
        if failure.status != 401:
            raise
        try:
            verdict = get_store().fail_sync(key, limit)
        except Exception as exc:  # noqa: BLE001  (any store failure: fail open)
            _store_down(exc)
            verdict = None
        raise _after_count(key, verdict, failure, "api") from None
    if principal is not None:
        _prove(key, authorization)
    return principal
