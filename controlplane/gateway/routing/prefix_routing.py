"""Prefix-cache-aware routing: send a request where its prefix is most likely cached, unless that
worker is overloaded.

The design is SGLang router's `cache_aware` policy (an approximate tree of recent prompts per
worker, kept by the router itself), not llm-d's precise scorer (workers publish KV block events,
the router tokenizes and hashes each prompt the way the engine does). Why, here:

- A worker's block hashes chain token ids under the tenant's cache salt (dataplane/kv_cache/
  block_hash.py). To match them the gateway would need each model's tokenizer and chat template on
  its hot path, and the salts to be used outside the engine; an event stream per worker is more
  moving parts than the gains on 2-4 replicas justify.
- The gateway already knows what it sent where. It hashes the request's leading text in fixed
  chunks, chained from a root keyed by the tenant's cache salt and the model, and remembers per
  worker which chunk chains it routed there recently (`PrefixTable`). Another tenant's identical
  prompt chains from another root, so it never matches: the table holds salted hashes only, as the
  workers' caches do, and no prompt text.
- Approximate: a worker evicts under memory pressure without telling the gateway, and each gateway
  process keeps its own table, shared with the other gateways through Redis when REDIS_URL is set
  (shared_prefixes.py). The table forgets by LRU within a per-worker budget sized like the
  workers' KV caches (`capacity_chunks`), so a prefix routed long ago stops attracting traffic.

Choice (`choose`): if the candidates' loads are imbalanced (max - min > BALANCE_ABS and max >
BALANCE_REL x min, SGLang's rule), the least loaded. Otherwise each worker within BALANCE_ABS of the
least loaded scores matched characters - LOAD_PENALTY_CHARS x its load; no match anywhere: the least
loaded, ties to the worker holding the least (most room to cache), then rendezvous on the prefix.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

CHUNK_CHARS = 128  # ~32 tokens (2 KV blocks of 16) of English or JSON-ish chat text
MAX_ROUTE_CHARS = 64 * 1024  # hash at most this much of a prompt: 512 chunks
# A worker's KV cache in chunks: the default is 256 MiB of SmolLM2-135M cache (11.5k tokens) /
# 32 tokens a chunk; set per registry for other models or cache sizes.
DEFAULT_CAPACITY_CHUNKS = 360
BALANCE_ABS = 4  # requests: a load gap within this never counts as imbalance...
BALANCE_REL = 1.5  # ...nor a max load within this factor of the min
LOAD_PENALTY_CHARS = 512  # one more outstanding request costs as much as this much matched prefix


class Loaded(Protocol):
    url: str
    outstanding: int
    waiting: int
    running: int


@dataclass(frozen=True, slots=True)
class PrefixKey:
    chunks: tuple[bytes, ...]  # chained hashes of the leading CHUNK_CHARS chunks, salted
    tail_chars: int  # characters after the last full chunk (not matchable)
    rendezvous: bytes  # stable tie-breaker: the first chunk's hash, or the salted root


def _root(cache_salt: str, model: str) -> bytes:
    return hashlib.blake2b(b"tessera-route\x00" + cache_salt.encode() + b"\x00" + model.encode(),
                           digest_size=16).digest()


def prompt_text(kind: str, body: dict[str, Any]) -> str:
    """The part of a parsed request that decides its KV prefix, serialized stably.

    Chat: tools (templates put them first), then each message in order; completions: the (first)
    prompt. Roles, names and tool calls are part of the key: they change the rendered tokens.
    """
    if kind == "chat":
        parts, size = [_dump(body.get("tools") or [])], 0
        for message in body.get("messages", []):
            if size > MAX_ROUTE_CHARS:  # only the head is hashed: a long history costs no more
                break
            parts.append(_dump(message))
            size += len(parts[-1])
        return "\x1e".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else ",".join(map(str, prompt or []))


def _dump(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONEncodeError:  # nested deeper than orjson writes (254 levels; the parser takes 1024)
        return "\x00nested"  # such a message only loses its part of the key, the request still routes


def prefix_key(text: str, cache_salt: str, model: str) -> PrefixKey:
    text = text[:MAX_ROUTE_CHARS]
    parent = root = _root(cache_salt, model)
    chunks = []
    for start in range(0, len(text) - CHUNK_CHARS + 1, CHUNK_CHARS):
        parent = hashlib.blake2b(parent + text[start:start + CHUNK_CHARS].encode("utf-8", "surrogatepass"),
                                 digest_size=16).digest()
        chunks.append(parent)
    return PrefixKey(tuple(chunks), len(text) - len(chunks) * CHUNK_CHARS, chunks[0] if chunks else root)


class PrefixTable:
    """Per worker: the salted chunk hashes recently routed there, in LRU order, within a budget."""

    def __init__(self, capacity_chunks: int = DEFAULT_CAPACITY_CHUNKS) -> None:
        if capacity_chunks < 1:
            raise ValueError(f"capacity_chunks: must be >= 1, got {capacity_chunks}")
        self.capacity_chunks = capacity_chunks
        self._held: dict[str, OrderedDict[bytes, None]] = {}

    def matched_chunks(self, url: str, key: PrefixKey) -> int:
        held = self._held.get(url)
        if not held:
            return 0
        n = 0
        for h in key.chunks:  # a chain: the first miss ends the shared prefix
            if h not in held:
                break
            n += 1
        return n

    def record(self, url: str, key: PrefixKey) -> None:
        """The request went to `url`: its chunks are (about to be) cached there."""
        held = self._held.setdefault(url, OrderedDict())
        # Deepest first, so a prefix's first chunks are the most recent: the engine frees a sequence's
        # blocks tail first too, and a kept child is useless once its parent is gone.
        for h in reversed(key.chunks):
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.capacity_chunks:
            held.popitem(last=False)

    def size(self, url: str) -> int:
        return len(self._held.get(url, ()))

    def forget(self, url: str) -> None:
        """A worker that restarted or left holds nothing any more."""
        self._held.pop(url, None)

    def retain(self, urls: set[str]) -> None:
        """Drop the workers no longer listed (replicas come and go under new URLs)."""
        for url in set(self._held) - urls:
            del self._held[url]


def load_of(worker: Loaded) -> int:
    """Requests at the worker: this gateway's in flight there (fresh), or the engine's running and
    waiting at the last poll (stale by up to a poll, but it counts other gateways' work), the larger."""
    return max(worker.outstanding, worker.running + worker.waiting)


def _rendezvous(worker: Loaded, key: PrefixKey) -> bytes:
    return hashlib.blake2b(key.rendezvous + worker.url.encode(), digest_size=8).digest()


def choose(workers: Sequence[Loaded], key: PrefixKey, table: PrefixTable, *,
           shared: Mapping[str, int] | None = None, balance_abs: int = BALANCE_ABS,
           balance_rel: float = BALANCE_REL, load_penalty_chars: int = LOAD_PENALTY_CHARS) -> tuple[Loaded, int]:
    """(worker, matched characters expected to be cached there). `workers` is not empty. `shared`:
    matched chunks per worker URL as every gateway routed them (shared_prefixes.py), merged with this
    process's table by the longer match; None or empty: this table alone."""
    loads = {w.url: load_of(w) for w in workers}

    def matched_chunks(url: str) -> int:
        mine = table.matched_chunks(url, key)
        return max(mine, shared.get(url, 0)) if shared else mine
    least, most = min(loads.values()), max(loads.values())

    def least_loaded() -> Loaded:
        return min(workers, key=lambda w: (loads[w.url], table.size(w.url), _rendezvous(w, key)))

    if most - least > balance_abs and most > balance_rel * least:
        chosen = least_loaded()
        return chosen, matched_chunks(chosen.url) * CHUNK_CHARS
    eligible = [w for w in workers if loads[w.url] <= least + balance_abs]
    matched = {w.url: matched_chunks(w.url) * CHUNK_CHARS for w in eligible}
    if not any(matched.values()):
        return least_loaded(), 0
    best = max(eligible, key=lambda w: (matched[w.url] - load_penalty_chars * loads[w.url], -loads[w.url],
                                        _rendezvous(w, key)))
    return best, matched[best.url]
