"""`POST /v1/embeddings` in OpenAI's shape, served by the same engine as generation.

Each input is one prompt-only engine request (`SamplingParams(max_tokens=0, pooling=...)`): it goes
through the scheduler like any prefill, under the caller's priority, the token budget and the ITL
guard, so embedding traffic shares the worker with generation the way a long prompt does. Its
vector is the final hidden states pooled by the worker's `--pooling` (last token by default, or
mean), L2-normalized (dataplane/runner/pooling.py).

Taken: `input` (a string, strings, token ids or token-id lists), `model`, `encoding_format` (float or
base64: little-endian float32, as the official client decodes it), `user` (ignored), `dimensions`
only when it equals the model's hidden size: these models were not trained for shortened
(Matryoshka) vectors, so a truncation would be a different, worse embedding. Usage is the inputs'
tokens (`prompt_tokens` = `total_tokens`); no cached-token split is reported.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
import time

import orjson
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from dataplane.outputs import RequestOutput
from dataplane.sampling_params import SamplingParams
from dataplane.worker import errors
from dataplane.worker.adapters import resolve_model
from dataplane.worker.generation import RequestContext
from dataplane.worker.openai_request import Serving, _parse, _priority
from dataplane.worker.streaming import race_disconnect
from dataplane.worker.unknown_fields import refuse_unknown

log = logging.getLogger("tessera.worker")

ENCODINGS = ("float", "base64")


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # unknown fields are refused by name

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: str | None = None
    dimensions: int | None = None
    user: str | None = None


def _inputs(serving: Serving, value: str | list) -> list[list[int]]:
    """Every input as token ids; empty ones refused, naming their index."""
    if isinstance(value, str):
        value = [value]
    elif value and isinstance(value[0], int):
        value = [value]
    if not value:
        raise errors.invalid("input: must not be empty (a string, or a non-empty array of strings or token "
                             "ids)", "input")
    ids = []
    for i, item in enumerate(value):
        where = "input" if len(value) == 1 else f"input[{i}]"
        if not item:
            raise errors.invalid(f"{where}: must not be empty", where)
        ids.append(serving.engine.tokenizer.encode(item) if isinstance(item, str) else item)
        if not ids[-1]:
            raise errors.invalid(f"{where}: has no tokens", where)
    return ids


def prepare(serving: Serving, raw: bytes, allowance: int | None) -> tuple[list[list[int]], str, str | None]:
    """(token ids per input, encoding, adapter): every check that needs no engine step, before anything queues."""
    try:
        return _prepare(serving, raw, allowance)
    except errors.WorkerError:
        serving.metrics.embedding("rejected")
        raise


def _prepare(serving: Serving, raw: bytes, allowance: int | None) -> tuple[list[list[int]], str, str | None]:
    req = _parse(EmbeddingRequest, raw)
    refuse_unknown(req.model_extra)
    adapter = resolve_model(req.model, serving.config.model_id, serving.engine)
    encoding = req.encoding_format or "float"
    if encoding not in ENCODINGS:
        raise errors.invalid(f"encoding_format: must be float or base64, got {encoding!r}", "encoding_format")
    hidden = serving.engine.core.model.args.hidden_size
    if req.dimensions is not None and req.dimensions != hidden:
        raise errors.invalid(f"dimensions: this model's embeddings have {hidden} dimensions and cannot be "
                             "shortened (it was not trained for truncated vectors); omit dimensions",
                             "dimensions", "unsupported_parameter")
    inputs = req.input
    count = 1 if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)) else len(inputs)
    limit = serving.config.max_embedding_inputs
    if count > limit:
        raise errors.invalid(f"input: at most {limit} inputs per request on this worker, got {count}; send them "
                             "in smaller batches", "input", "too_many_inputs")
    ids = _inputs(serving, inputs)
    max_len = serving.engine.max_model_len
    for i, p in enumerate(ids):
        if len(p) > max_len:
            where = "input" if len(ids) == 1 else f"input[{i}]"
            raise errors.WorkerError(
                f"{where}: {len(p)} tokens, but this model's maximum context length is {max_len} tokens. "
                "Please shorten the input.", status=400, code="context_length_exceeded", param=where)
    total = sum(map(len, ids))
    if allowance is not None and total > allowance:
        raise errors.WorkerError(
            f"The input has {total} tokens; this request was allowed {allowance} tokens under your limits. "
            "Shorten the input or send fewer inputs.", status=400, code="token_allowance_exceeded", param="input")
    return ids, encoding, adapter


async def run(serving: Serving, prepared: tuple[list[list[int]], str, str | None], ctx: RequestContext) -> Response:
    ids, encoding, adapter = prepared
    prio = _priority(ctx.priority, None)
    try:
        serving._admit(prio)
    except errors.WorkerError:
        serving.metrics.embedding("rejected")
        raise
    params = SamplingParams(max_tokens=0, pooling=serving.config.pooling)
    usage = serving.usage.start(ctx.request_id, sum(map(len, ids)), len(ids))
    rids = [serving._claim(ctx.request_id if len(ids) == 1 else f"{ctx.request_id}-{i}") for i in range(len(ids))]
    # The tenant and its weight: embedding tokens count toward its fair share like any prompt's.
    gens = [serving.engine.generate(p, params, request_id=rid, priority=prio, cache_salt=ctx.cache_salt,
                                    adapter=adapter, tenant=ctx.tenant, tenant_weight=ctx.tenant_weight)
            for p, rid in zip(ids, rids, strict=True)]
    tasks = [asyncio.ensure_future(_last(g)) for g in gens]
    status = "cancelled"
    try:
        outs = await race_disconnect(ctx.receive, asyncio.gather(*tasks))
        missing = [o for o in outs if o is None or o.embedding is None]
        if missing:  # the engine failed the request (its step raised), or it ended without a vector
            reason = missing[0].outputs[0].error if missing[0] is not None else None
            raise errors.internal(f"The engine failed on an input: {reason or 'no vector came back'}")
        status = "ok"
    except errors.WorkerError:
        status = "engine_error"
        raise
    except BaseException as exc:
        mapped = serving.engine_error(exc, "input") if isinstance(exc, Exception) else None
        status = "engine_error" if mapped is not None else status
        if mapped is not None:
            raise mapped from None
        raise
    finally:
        for t in tasks:  # a pump still inside its generator is cancelled first: that aborts its request
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for g in gens:
            await g.aclose()
        serving.active.difference_update(rids)
        serving.usage.finish(usage, status)
        if status != "ok":
            serving.metrics.embedding("error" if status == "engine_error" else status)
    tokens = sum(map(len, ids))
    log.info("embeddings finished", extra={"request_id": ctx.request_id, "tenant": ctx.tenant, "inputs": len(ids),
                                           "prompt_tokens": tokens, "priority": prio,
                                           "latency_ms": round((time.monotonic() - ctx.started) * 1000, 2)})
    body = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": _encode(o.embedding, encoding)}
                                       for i, o in enumerate(outs)],
            "model": adapter or serving.config.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    response = Response(orjson.dumps(body), media_type="application/json")
    serving.metrics.embedding("ok", priority=prio, prompt_tokens=tokens, seconds=time.monotonic() - ctx.started)
    return response


async def _last(gen) -> RequestOutput | None:  # noqa: ANN001
    """The final output of an engine request (an embedding request yields once, when it finishes)."""
    final = None
    async for out in gen:
        final = out
    return final


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
