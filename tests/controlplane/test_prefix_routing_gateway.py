"""Cache-aware routing through the gateway to two fake workers (real HTTP servers): a tenant's next
turn follows its cached prefix; another tenant's identical prompt does not see it (salted)."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = "You are the support assistant of a bicycle shop; answer briefly and politely. " * 25


def conversation(*turns: str) -> dict:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return {"model": "fake-model", "messages": messages, "max_tokens": 2}


async def send(workers, secret: str, body: dict) -> int:
    """Send one chat request through the gateway; the index of the worker that received it."""
    before = [len(w.received) for w in workers]
    response = await AsyncClient().post("/v1/chat/completions", data=json.dumps(body), content_type="application/json",
                                        headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200, response.content
    (got,) = [i for i, w in enumerate(workers) if len(w.received) > before[i]]
    return got


async def test_a_tenants_next_turn_follows_its_prefix_and_other_tenants_do_not_see_it(gateway, tenant_key, workers,
                                                                                    drain) -> None:
    gateway.TESSERA_ROUTING_POLICY = "cache_aware"
    alice, alice_secret = await tenant_key()
    bob, bob_secret = await tenant_key()
    turn1 = conversation("Where is my order?")
    turn2 = conversation("Where is my order?", "It shipped on Monday.", "When will it arrive?")
    turn3 = conversation("Where is my order?", "It shipped on Monday.", "When will it arrive?", "Thursday.", "Thanks!")
    first = await send(workers, alice_secret, turn1)
    assert [await send(workers, alice_secret, turn2), await send(workers, alice_secret, turn3)] == [first, first]
    # The same words from another tenant chain from another salt: no match, so it goes where the
    # least is held (the other worker), not where Alice's blocks are.
    assert await send(workers, bob_secret, turn1) == 1 - first
    assert await send(workers, bob_secret, turn2) == 1 - first
    # Alice's other user shares her system prompt, and its salt: that prefix is Alice's to reuse.
    assert await send(workers, alice_secret, conversation("Do you sell helmets?")) == first
    assert {r.headers["x-cache-salt"] for r in workers[first].received} == {alice.cache_salt}
    assert {r.headers["x-cache-salt"] for r in workers[1 - first].received} == {bob.cache_salt}
    await drain()
