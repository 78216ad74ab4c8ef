"""The deployed ASGI application's start-up: what it built is frozen out of the cyclic collector."""

from __future__ import annotations

import gc

from controlplane.asgi import application


async def _start(app) -> list[dict]:
    sent, inbox = [], [{"type": "lifespan.startup"}]

    async def receive():
        return inbox.pop(0) if inbox else {"type": "lifespan.shutdown"}

    async def send(message):
        sent.append(message)

    await app({"type": "lifespan"}, receive, send)
    return sent


async def test_start_up_freezes_the_heap_only_when_asked(settings):
    gc.unfreeze()
    settings.TESSERA_GC_FREEZE = False
    assert (await _start(application))[0]["type"] == "lifespan.startup.complete"
    assert gc.get_freeze_count() == 0
    settings.TESSERA_GC_FREEZE = True
    try:
        await _start(application)
        assert gc.get_freeze_count() > 10_000  # Django and the gateway's modules, not a handful of objects
    finally:
        gc.unfreeze()
