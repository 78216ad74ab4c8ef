"""Prefill and decode on separate workers (docs/kv_cache.md, part 3).

A decode worker started with `--prefill-url` sends each prompt of at least `--prefill-min-tokens` tokens to a
prefill worker first: `POST /tessera/v1/kv/prefill` with the token ids, the cache salt and how many leading
blocks the decode worker already holds. The prefill worker computes the prompt (one token, discarded), and
answers with the KV blocks of its hash chain past those (kv_cache/transfer.py: checksummed, with the
layout's fingerprint). The decode worker keeps them in its second tier, then submits the request to its
own engine, whose prefix lookup finds them: it computes only the last block's tokens and streams.

Anything that goes wrong on the way (the prefill worker refuses, dies, times out, sends a short, corrupt or
foreign stream) costs only time: the blocks that arrived whole and verified are kept, and the decode worker
computes the rest itself, as a unified worker would. The client's request lives on the decode worker alone,
so it is answered and metered once; the prefill worker's request is its own, for one token, never billed.
LoRA requests are served unified: an adapter's key (name#uid) differs between workers, so their hash chains
could never match.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable

import httpx
import orjson
from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from dataplane.engine.async_llm import AsyncLLM
from dataplane.kv_cache.transfer import Decoder, encode, encoded_size
from dataplane.sampling_params import SamplingParams
from dataplane.worker import errors
from dataplane.worker.metrics import P, WorkerMetrics

log = logging.getLogger(__name__)

ROUTE = "/tessera/v1/kv/prefill"
LAYOUT_ROUTE = "/tessera/v1/kv/layout"
MEDIA_TYPE = "application/x-tessera-kv"
OUTCOMES = ("ok", "partial", "failed")


def prefill_routes(get_engine: Callable[[], AsyncLLM | None], authorize: Callable[[Request], None],
                   max_model_len: Callable[[], int]) -> list[Route]:
    """The prefill side: compute a prompt, answer with its blocks."""

    def ready(request: Request) -> AsyncLLM:
        authorize(request)
        engine = get_engine()
        if engine is None:
            raise errors.unavailable("The model is not loaded yet; retry shortly.", 1, "model_loading")
        return engine

    async def prefill(request: Request) -> Response:
        try:
            engine = ready(request)
            body = _body(await request.body())
            fingerprint, block_bytes = engine.kv_layout()
            if body["layout"] != fingerprint.hex():
                raise errors.WorkerError("layout: this worker's KV blocks have another layout (model, dtype, KV-cache "
                                         "dtype or block size differ)", status=409, code="layout_mismatch")
            ids = body["token_ids"]
            if len(ids) > max_model_len():
                raise errors.invalid(f"token_ids: {len(ids)} tokens, more than this worker's context of "
                                     f"{max_model_len()}", "token_ids")
            params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
            try:
                priority = int(request.headers.get("x-priority") or 0)
            except ValueError:
                raise errors.invalid("X-Priority: an integer", None) from None
            try:
                async for _ in engine.generate(ids, params, request_id=f"prefill-{uuid.uuid4().hex}",
                                               priority=priority, cache_salt=body["cache_salt"]):
                    pass
            except ValueError as exc:  # the engine's own checks (a token id past the vocabulary, ...)
                raise errors.invalid(str(exc), "token_ids") from None
            blocks = await engine.export_prefix(ids, body["cache_salt"], body["skip_blocks"])
        except errors.WorkerError as exc:
            return exc.response()
        return StreamingResponse(encode(blocks, fingerprint, block_bytes), media_type=MEDIA_TYPE,
                                 headers={"X-Tessera-KV-Blocks": str(len(blocks)),
                                          "Content-Length": str(encoded_size(len(blocks), block_bytes))})

    async def layout(request: Request) -> Response:
        """This worker's KV layout: two workers exchange blocks only when theirs are equal."""
        try:
            engine = ready(request)
        except errors.WorkerError as exc:
            return exc.response()
        fingerprint, block_bytes = engine.kv_layout()
        return Response(orjson.dumps({"layout": fingerprint.hex(), "block_bytes": block_bytes}),
                        media_type="application/json")

    return [Route(ROUTE, prefill, methods=["POST"]), Route(LAYOUT_ROUTE, layout, methods=["GET"])]


def _verify_chain(blocks: list[tuple[bytes, bytes]], expected: list[bytes], verified: int) -> int:
    """Check the blocks past the first `verified` against the prompt's chain (past what the decode worker
    holds, in order); the new count of verified blocks. ValueError at the first that is not the prompt's."""
    if len(blocks) > len(expected):
        raise ValueError(f"the prefill worker sent more blocks than the prompt's {len(expected)}")
    for i in range(verified, len(blocks)):
        if blocks[i][0] != expected[i]:
            raise ValueError(f"block {i} is not the prompt's (another hash)")
    return len(blocks)


def _body(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise errors.invalid("The body is not valid JSON.", None) from None
    if not isinstance(body, dict):
        raise errors.invalid("The body must be a JSON object.", None)
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
        raise errors.invalid("token_ids: a non-empty list of token ids", "token_ids")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or "\x00" in salt or len(salt) > 256):
        raise errors.invalid("cache_salt: a string of at most 256 characters", "cache_salt")
    skip = body.get("skip_blocks", 0)
    if type(skip) is not int or skip < 0:
        raise errors.invalid("skip_blocks: an integer >= 0", "skip_blocks")
    layout = body.get("layout")
    if not isinstance(layout, str):
        raise errors.invalid("layout: the sender's KV layout fingerprint (hex)", "layout")
    return {"token_ids": ids, "cache_salt": salt, "skip_blocks": skip, "layout": layout}


class PrefillClient:
    """The decode side: fetch a prompt's blocks from a prefill worker into this engine's second tier."""

    def __init__(self, engine: AsyncLLM, urls: list[str], token: str, min_tokens: int, timeout: float,
                 metrics: WorkerMetrics) -> None:
        self.engine = engine
        self.urls = itertools.cycle([u.rstrip("/") for u in urls]) if urls else None
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.min_tokens = min_tokens
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)))
        self.fingerprint, self.block_bytes = engine.kv_layout()
        r, name = metrics.registry, metrics.model_name
        self.requests = Counter(P + "disagg_prefill_requests", "Prompts sent to a prefill worker, by outcome: ok; "
                                "partial (some blocks came, the rest was computed here); failed (computed here)",
                                ["model_name", "outcome"], registry=r)
        for outcome in OUTCOMES:
            self.requests.labels(name, outcome)
        self.blocks = Counter(P + "disagg_blocks_received", "KV blocks received from prefill workers",
                              ["model_name"], registry=r).labels(name)
        self.bytes = Counter(P + "disagg_bytes_received", "Bytes of KV blocks received from prefill workers",
                             ["model_name"], registry=r).labels(name)
        self.seconds = Counter(P + "disagg_prefill_seconds", "Seconds from asking a prefill worker to holding its "
                               "blocks (its prefill included)", ["model_name"], registry=r).labels(name)
        self.name = name

    def wants(self, token_ids: list[int], adapter: str | None) -> bool:
        return adapter is None and len(token_ids) >= self.min_tokens

    async def prepare(self, token_ids: list[int], cache_salt: str | None, priority: int,
                      url: str | None = None) -> str:
        """Bring the prompt's blocks here; the outcome. Never raises for the prefill worker's failures.
        `url`: the prefill worker the gateway named for this request (else this worker's own, in turn)."""
        t0 = time.monotonic()
        decoder = Decoder(self.fingerprint, self.block_bytes)
        outcome = "failed"
        verified = 0  # leading blocks received and found to be the prompt's own
        expected: list[bytes] = []  # stays empty if the engine cannot say what it wants
        try:
            skip, expected = await self.engine.wanted_blocks(token_ids, cache_salt)
            if not expected:
                outcome = "ok"  # every block is here already: nothing to ask for
            else:
                body = {"token_ids": token_ids, "cache_salt": cache_salt, "skip_blocks": skip,
                        "layout": self.fingerprint.hex()}
                target = url.rstrip("/") if url else next(self.urls)
                async with self.client.stream("POST", target + ROUTE, content=orjson.dumps(body),
                                              headers={**self.headers, "Content-Type": "application/json",
                                                       "X-Priority": str(priority)}) as r:
                    if r.status_code != 200:
                        raise ValueError(f"prefill worker answered {r.status_code}: {(await r.aread())[:200]!r}")
                    async for chunk in r.aiter_raw():
                        decoder.feed(chunk)
                        verified = _verify_chain(decoder.blocks, expected, verified)
                decoder.finish()
                outcome = "ok"
        except (httpx.HTTPError, ValueError, OSError) as exc:
            log.warning("prefill worker: %s; computing the prompt here (%d blocks arrived)", exc, len(decoder.blocks))
        except asyncio.CancelledError:
            raise  # the client left: nothing to keep waiting for
        # Only the prompt's own chain, in order, from its start: a block under any other hash (a stale or
        # broken sender) would sit in the tier for a prompt nobody asked about.
        # (a feed that failed may have brought whole blocks not yet checked: those of the chain still count)
        while verified < min(len(decoder.blocks), len(expected)) and decoder.blocks[verified][0] == expected[verified]:
            verified += 1
        good = decoder.blocks[:verified]
        if outcome != "ok":
            outcome = "partial" if good else "failed"
        if good:
            kept = await self.engine.import_blocks(good)
            self.blocks.inc(kept)
            self.bytes.inc(kept * self.block_bytes)
        self.seconds.inc(time.monotonic() - t0)
        self.requests.labels(self.name, outcome).inc()
        return outcome

    async def close(self) -> None:
        await self.client.aclose()
