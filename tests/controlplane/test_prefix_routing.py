"""Prefix-cache-aware routing with no model and no network: salted chunk keys, the per-worker
table, the choice between cache hit and load, and the registry's policies."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.gateway.routing.prefix_routing import (
    CHUNK_CHARS,
    PrefixTable,
    choose,
    prefix_key,
    prompt_text,
)
from controlplane.gateway.routing.workers import ModelTarget, Registry, Worker

SYSTEM = "You are the support assistant of a bicycle shop. " * 40  # ~2000 characters


def chat(*turns: str) -> str:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return prompt_text("chat", {"messages": messages})


def workers(n: int, loads: list[int] | None = None) -> list[Worker]:
    out = [Worker(f"http://w{i}", ready=True, models={"m": ModelTarget("m", "m", None)}) for i in range(n)]
    for w, load in zip(out, loads or [0] * n, strict=True):
        w.outstanding = load
    return out


def test_keys_chain_so_a_longer_conversation_extends_the_shorter_one() -> None:
    first = prefix_key(chat("Where is my order?"), "salt-a", "m")
    second = prefix_key(chat("Where is my order?", "It shipped.", "When does it arrive?"), "salt-a", "m")
    assert len(first.chunks) == len(chat("Where is my order?")) // CHUNK_CHARS > 5
    assert second.chunks[: len(first.chunks)] == first.chunks
    other_question = prefix_key(chat("Do you sell helmets? " * 20), "salt-a", "m")
    shared = sum(1 for a, b in zip(first.chunks, other_question.chunks, strict=False) if a == b)
    assert shared == len(SYSTEM) // CHUNK_CHARS  # the system prompt's full chunks, then they differ
    assert other_question.chunks[shared + 1] not in first.chunks


def test_another_salt_or_model_shares_no_chunk() -> None:
    text = chat("Where is my order?")
    mine = set(prefix_key(text, "salt-a", "m").chunks)
    assert not mine & set(prefix_key(text, "salt-b", "m").chunks)
    assert not mine & set(prefix_key(text, "salt-a", "m-lora").chunks)
    assert prefix_key("short", "salt-a", "m").chunks == ()


def test_completions_prompts_and_token_ids() -> None:
    assert prompt_text("completions", {"prompt": ["abc", "def"]}) == "abc"
    assert prompt_text("completions", {"prompt": [1, 2, 3]}) == "1,2,3"
    assert prompt_text("completions", {"prompt": [[4, 5], [6]]}) == "4,5"


def test_a_message_nested_deeper_than_json_encoders_go_still_gets_a_key() -> None:
    deep: dict = {}
    for _ in range(1000):  # the JSON parser takes 1024 levels, the encoder 254
        deep = {"x": deep}
    body = {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "assistant", "content": None, "tool_calls": [{"function": deep}]}]}
    text = prompt_text("chat", body)
    assert text.startswith(prompt_text("chat", {"messages": body["messages"][:1]}))  # the system prompt still keys


def test_table_matches_the_leading_chain_and_forgets_deepest_chunks_first() -> None:
    table = PrefixTable(capacity_chunks=10)
    key = prefix_key(chat("Where is my order?"), "s", "m")
    table.record("http://w0", key)
    n = len(key.chunks)
    assert n > 10
    # Over capacity: the leading 10 chunks stay (the engine keeps a prefix's head longest too).
    assert table.size("http://w0") == 10 and table.matched_chunks("http://w0", key) == 10
    assert table.matched_chunks("http://w1", key) == 0
    table.forget("http://w0")
    assert table.matched_chunks("http://w0", key) == 0
    table.record("http://w0", key)
    table.record("http://w1", key)
    table.retain({"http://w1"})  # w0 left the routing table
    assert (table.size("http://w0"), table.size("http://w1")) == (0, 10)
    with pytest.raises(ValueError, match="capacity_chunks"):
        PrefixTable(0)


def test_a_match_wins_at_equal_load_and_loses_to_a_large_load_gap() -> None:
    table = PrefixTable()
    key = prefix_key(chat("Where is my order?"), "s", "m")
    ws = workers(3)
    table.record("http://w2", key)
    chosen, matched = choose(ws, key, table)
    assert chosen.url == "http://w2" and matched == len(key.chunks) * CHUNK_CHARS
    ws[2].outstanding = 1  # one more request there costs less than ~1000 cached characters
    assert choose(ws, key, table)[0].url == "http://w2"
    ws[2].outstanding = 6  # beyond the balance threshold: overloaded, imbalanced, least loaded wins
    assert choose(ws, key, table)[0].url in {"http://w0", "http://w1"}


def test_the_penalty_trades_matched_characters_against_load() -> None:
    table = PrefixTable()
    long_key = prefix_key(chat("Where is my order?"), "s", "m")
    short_key = prefix_key(SYSTEM[: 2 * CHUNK_CHARS], "s", "m")
    ws = workers(2, [0, 2])
    table.record("http://w1", long_key)
    assert choose(ws, long_key, table, load_penalty_chars=100)[0].url == "http://w1"
    assert choose(ws, long_key, table, load_penalty_chars=10_000)[0].url == "http://w0"
    table.record("http://w1", short_key)
    assert choose(ws, short_key, table, load_penalty_chars=200)[0].url == "http://w0"  # 256 chars < 2 x 200


def test_no_match_goes_to_the_least_loaded_then_the_emptiest() -> None:
    table = PrefixTable()
    ws = workers(3, [2, 0, 0])
    table.record("http://w1", prefix_key(chat("Something else entirely"), "t", "m"))
    chosen, matched = choose(ws, prefix_key(chat("Where is my order?"), "s", "m"), table)
    assert (chosen.url, matched) == ("http://w2", 0)


def test_queued_work_at_the_engine_counts_as_load() -> None:
    table = PrefixTable()
    key = prefix_key(chat("Where is my order?"), "s", "m")
    ws = workers(2)
    table.record("http://w0", key)
    ws[0].waiting = 9  # another gateway's requests queued there
    assert choose(ws, key, table)[0].url == "http://w1"


def _registry(settings, policy: str, n: int = 3) -> Registry:
    settings.TESSERA_ROUTING_POLICY = policy
    reg = Registry([f"http://w{i}" for i in range(n)])
    for w in reg.workers:
        w.ready, w.models = True, {"m": ModelTarget("m", "m", None)}
    return reg


def test_registry_policies(settings) -> None:
    key = prefix_key(chat("Where is my order?"), "s", "m")
    rr = _registry(settings, "round_robin")
    assert [rr.pick("m", b"k", prefix=key).url for _ in range(4)] == ["http://w0", "http://w1", "http://w2", "http://w0"]
    ll = _registry(settings, "least_loaded")
    ll.workers[0].outstanding, ll.workers[1].outstanding = 3, 1
    assert ll.pick("m", b"k", prefix=key).url == "http://w2"
    assert {ll.pick("m", b"k").url for _ in range(3)} == {"http://w2"}
    ll.workers[2].outstanding = 1
    assert {ll.pick("m", b"k").url for _ in range(4)} == {"http://w1", "http://w2"}  # ties rotate
    ca = _registry(settings, "cache_aware")
    first = ca.pick("m", b"k", prefix=key)
    assert all(ca.pick("m", b"k", prefix=key) is first for _ in range(3))
    assert ca.pick("m", b"k", prefix=key, exclude={first.url}) is not first
    with pytest.raises(ImproperlyConfigured, match="TESSERA_ROUTING_POLICY"):
        _registry(settings, "random")


def test_the_deployments_registry_routes_cache_aware_and_drops_workers_that_left() -> None:
    from controlplane.deployments.routing import DeploymentRegistry
    from controlplane.deployments.selectors import Route

    reg = DeploymentRegistry()
    reg.apply([Route(f"http://w{i}", "m", "m", None, None) for i in range(2)])
    key = prefix_key(chat("Where is my order?"), "s", "m")
    first = reg.pick("m", b"k", prefix=key)
    assert reg.pick("m", b"k", prefix=key) is first
    reg.apply([Route(u, "m", "m", None, None) for u in ("http://w0", "http://w1") if u != first.url])
    assert reg.prefixes.size(first.url) == 0
