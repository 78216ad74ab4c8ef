"""A request keeps its reservation for as long as it runs.

A reservation expires TESSERA_RESERVATION_TTL_SECONDS (900) after it is made, so that a gateway that
dies cannot hold a tenant's concurrency slots for ever. A request that simply runs longer (a stream
held open for 20 minutes, a long generation) must not lose its slot for that: it would let the tenant
run more requests at once than its tier allows, and its settlement would find no reservation to
apply to (the month's counters kept the reserved tokens instead of the used ones).

So each event loop that serves requests holds their meters here, and while any is held one task
renews them all every third of the TTL, in one limiter call (`Limiter.renew`: one UPDATE, or one
Redis script per tenant). A live request's reservation thus always has at least two thirds of the
TTL ahead of it; a dead gateway's stop being renewed and expire as before. Meters are held weakly and
dropped when finished, so a request that ends by any path (or is collected unfinished) is never
renewed again, and the task ends when nothing is held (at once when the last request finishes).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Protocol

from django.conf import settings

from tenants.auth import KeyPrincipal
from tenants.limits import get_limiter

log = logging.getLogger("tessera.gateway")

MIN_INTERVAL = 0.5  # seconds; only a TTL shortened for tests gets near it


class Meter(Protocol):
    """What is renewed: accounting.Meter (not imported: it imports this module)."""

    request_id: str
    principal: KeyPrincipal
    finished: bool


_held: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet] = weakref.WeakKeyDictionary()
_tickers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task] = weakref.WeakKeyDictionary()


def interval() -> float:
    return max(MIN_INTERVAL, settings.TESSERA_RESERVATION_TTL_SECONDS / 3)


def hold(meter: Meter) -> None:
    """Renew `meter`'s reservation until it is released or finished. Call on the loop serving it."""
    loop = asyncio.get_running_loop()
    _held.setdefault(loop, weakref.WeakSet()).add(meter)
    ticker = _tickers.get(loop)
    if ticker is None or ticker.done():
        _tickers[loop] = loop.create_task(_renew_while_held(loop), name="reservation-renewal")


def release(meter: Meter) -> None:
    """Stop renewing `meter`'s reservation; with nothing left to renew on its loop, stop that loop's
    task too (an idle process keeps no timer, and a loop that closes leaves no task behind)."""
    for loop, held in list(_held.items()):
        if meter not in held:
            continue
        held.discard(meter)
        if not held and (ticker := _tickers.pop(loop, None)) is not None and not loop.is_closed():
            loop.call_soon_threadsafe(ticker.cancel)


async def _renew_while_held(loop: asyncio.AbstractEventLoop) -> None:
    while True:
        await asyncio.sleep(interval())
        live = [m for m in list(_held.get(loop, ())) if not m.finished]
        if not live:
            return  # the next hold() starts a new task
        try:
            await get_limiter().renew([(m.principal.tenant_id, m.request_id) for m in live])
        except Exception as exc:  # the limiter's store is away: try again next time, well before expiry
            log.warning("could not renew reservations", extra={"held": len(live), "error": repr(exc)[:200]})
