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


async def send(secret: str, body: dict) -> None:
    response = await AsyncClient().post("/v1/chat/completions", data=json.dumps(body), content_type="application/json",
                                        headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200, response.content


def served_by(workers, salt: str) -> list[int]:
    """Indexes of the workers that received this tenant's requests, in order."""
    got = [(r.headers.get("x-request-id"), i) for i, w in enumerate(workers) for r in w.received
           if r.headers.get("x-cache-salt") == salt]
    return [i for _, i in sorted(got)]  # request ids are time-ordered


async def test_a_tenants_next_turn_follows_its_prefix_and_other_tenants_do_not_see_it(gateway, tenant_key, workers,
                                                                                    drain) -> None:
    gateway.TESSERA_ROUTING_POLICY = "cache_aware"
    alice, alice_secret = await tenant_key()
    bob, bob_secret = await tenant_key()
    await send(alice_secret, conversation("Where is my order?"))
    (first,) = served_by(workers, alice.cache_salt)
    await send(alice_secret, conversation("Where is my order?", "It shipped on Monday.", "When will it arrive?"))
    await send(alice_secret, conversation("Where is my order?", "It shipped on Monday.", "When will it arrive?",
                                          "Thursday.", "Thanks!"))
    assert served_by(workers, alice.cache_salt) == [first, first, first]
    # The same words from another tenant chain from another salt: no match, so it goes where the
    # least is held (the other worker), not where Alice's blocks are.
    await send(bob_secret, conversation("Where is my order?"))
    assert served_by(workers, bob.cache_salt) == [1 - first]
    await send(bob_secret, conversation("Where is my order?", "It shipped on Monday.", "When will it arrive?"))
    assert served_by(workers, bob.cache_salt) == [1 - first, 1 - first]
    await drain()
