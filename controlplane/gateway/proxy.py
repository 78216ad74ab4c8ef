"""One request through the gateway: auth → limits → route → stream → meter.

Every response carries `x-request-id` (gateway-assigned: a client cannot pick the id billing
deduplicates on). Once a reservation is made, exactly one `Meter.finish` follows on every path.

Under a hard budget the reservation bounds what the worker may serve: the prompt is reserved at
its upper bound (parsing.py), the worker is told the reserved tokens (`X-Token-Allowance`), refuses
a prompt that alone exceeds them and clamps completions to the rest, so tokens served ≤ tokens
reserved ≤ budget under any concurrency. Other tenants' reservations use the typical estimate and
carry no allowance (their limits settle to what was served; nothing is cut short). While the worker
starts on the request, and before the first byte goes to the client, the request is written to the
usage journal (journal.py), so a gateway that dies mid-request leaves a row for the sweeper; one that
dies before the row is written has relayed nothing, and the worker stops when its connection drops.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
import weakref

import httpx
import orjson
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from common import write_priority
from common.asyncdb import db_call
from common.client_ip import client_ip
from common.errors import ApplicationError
from common.single_flight import SingleFlight
from controlplane.gateway import outages, parsing, upstream
from controlplane.gateway.error_bodies import error_response, ratelimit_headers, refusal
from controlplane.gateway.routing import admission
from controlplane.gateway.routing.prefix_routing import prefix_key, prompt_text
from controlplane.gateway.routing.workers import ModelTarget, Worker, get_registry, visible_to
from controlplane.gateway.server_timing import ServerTiming
from controlplane.gateway.sse import StreamMeter, usage_counts
from controlplane.gateway.usage import accounting, journal, renewal, usage_writer, worker_usage
from controlplane.gateway.usage.accounting import Meter
from controlplane.gateway.usage.worker_usage import WorkerCounts
from controlplane.slo import content_log
from controlplane.slo import metrics as slo_metrics
from tenants import auth, auth_throttle
from tenants.auth import KeyPrincipal
from tenants.limits import LimitPlan, get_limiter, period_start, refusals

log = logging.getLogger("tessera.gateway")

MAX_ATTEMPTS = 3  # workers tried when a connection fails before the first byte
RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.PoolTimeout)
PASS_HEADERS = ("content-type",)
UPSTREAM_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
USAGE_QUERY_WAIT = 2.0  # seconds the worker may take to finish aborting before it answers with final counts


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


async def principal_for(authorization: str | None, *, lookup: bool = True) -> KeyPrincipal | None:
    """The key behind an Authorization header; 401/403 (ApplicationError) for a key that cannot serve.
    With lookup=False only the header's shape is checked (None back): the handler's cheap pre-check."""
    secret = auth.bearer_secret(authorization)
    if not auth.looks_like_key(secret):
        raise auth.invalid_key()
    if not lookup:
        return None
    return await principal_for_hash(auth.hash_secret(secret))


_key_lookups: SingleFlight = SingleFlight()  # key hash -> the database lookup in flight


async def principal_for_hash(key_hash: str) -> KeyPrincipal:
    """The key with this stored hash, as an online request sees it now (the batch runner holds only the
    hash): the process's key cache, the database, or while the database just failed the key as it last
    said; 401/403 (ApplicationError) for a key that cannot serve."""
    hit, principal = auth.cached_lookup_hash(key_hash)
    if not hit and outages.recently_down("database"):
        # Do not make every request wait on a database that just failed (a hung one costs a connect
        # timeout each): the key as the database last said, if it did so recently.
        hit, principal = auth.last_known_hash(key_hash)
        if hit:
            outages.note_serving_from_memory("keys")
    if not hit:
        try:
            # one lookup for the requests that miss together (a burst's start, the entry just expired)
            principal = await _key_lookups.run(key_hash, lambda: db_call(auth.lookup_hash, key_hash))
        except Exception as exc:
            if outages.dependency_of(exc) != "database":
                raise
            outages.mark_down("database")
            hit, principal = auth.last_known_hash(key_hash)  # a database blink: the key as it was moments ago
            if not hit:
                raise
            outages.note_serving_from_memory("keys")
    return auth.check(principal)


async def authenticate(request: HttpRequest) -> KeyPrincipal:
    # Failed keys are throttled per client address; a valid key pays nothing for it (auth_throttle.py).
    # META, not request.headers: building that mapping of every header cost more than the rest of a refusal.
    principal = await auth_throttle.guarded(client_ip(request), request.META.get("HTTP_AUTHORIZATION"), principal_for)
    accounting.note_key_used(principal.key_id)
    return principal


def authorize(principal: KeyPrincipal, target: ModelTarget) -> None:
    if not visible_to(target, principal.tenant_id):  # another tenant's adapter: as if it did not exist
        raise ApplicationError(
            f"The model `{target.name}` does not exist or you do not have access to it.",
            code="model_not_found", status=404, param="model",
        )
    if not principal.may_use(target.base, target.adapter):
        raise ApplicationError(
            f"This API key may not use the model `{target.name}`.", code="model_not_allowed", status=403,
            param="model",
        )


def exact(limits) -> bool:
    """Whether this tenant's limits promise exactness: a hard monthly token or spend budget."""
    return limits.hard_budget and (limits.monthly_token_budget is not None or limits.monthly_spend_budget is not None)


def reserved_prompt(principal: KeyPrincipal, parsed: parsing.ParsedRequest) -> int:
    """Under a hard budget the prompt is reserved at its upper bound, because the reservation is then
    the worker's allowance; otherwise at the estimate (rate limits settle any difference)."""
    return parsed.prompt_bound if exact(principal.limits) else parsed.prompt_estimate


async def checked(principal: KeyPrincipal, raw: bytes, kind: str) -> tuple[parsing.ParsedRequest, ModelTarget]:
    """Everything decided before the limiter, in order: the body (400), the model (404, 403), overload (429)."""
    parsed = parsing.parse(raw, kind)
    registry = get_registry()
    await registry.ensure_polling()
    authorize(principal, target := registry.resolve(parsed.model))
    await registry.cold_start(target)  # a deployment scaled to zero: 503 + Retry-After, and it wakes
    admission.check(registry, parsed.model, principal.limits.priority)  # overload: lowest tiers first
    return parsed, target


def reserved_tokens(principal: KeyPrincipal, parsed: parsing.ParsedRequest) -> int:
    return reserved_prompt(principal, parsed) + parsed.max_completion * parsed.n


async def remembered_refusal(authorization: str | None, raw: bytes, kind: str) -> HttpResponse | None:
    """The 429 for a tenant the limits refuse from memory (tenants/limits/refusals.py), answered by the
    /v1 handler before Django builds a request: the key from the process cache, then the same checks as
    handle() in the same order. None whenever anything else might answer (a key not cached, a bad body,
    no remembered refusal, a spend budget to price): handle() then decides as always."""
    if not refusals.any_remembered():
        return None
    try:
        hit, principal = auth.cached_lookup(auth.bearer_secret(authorization))
        if not hit or principal is None or not refusals.remembers(principal.tenant_id):
            return None
        principal = auth.check(principal)
        if principal.limits.monthly_spend_budget is not None:
            return None
        parsed, _ = await checked(principal, raw, kind)
    except Exception:  # noqa: BLE001  (the view gives that answer: its error, or a dependency's 503)
        return None
    decision = refusals.recall(LimitPlan(principal.tenant_id, "", principal.limits, reserved_tokens(principal, parsed), 0))
    if decision is None:
        return None
    accounting.note_key_used(principal.key_id)
    error = refusal(decision, principal.tenant_slug, reserved_tokens(principal, parsed))
    slo_metrics.observe_rejection(tier=principal.limits.tier, reason=slo_metrics.rejection_reason(error.code, error.type))
    return error_response(error, new_request_id())


async def reserve(principal: KeyPrincipal, parsed: parsing.ParsedRequest, target: ModelTarget, request_id: str,
                  batch: bool = False):
    spend = 0
    embeddings = parsed.kind == "embeddings"
    prompt = reserved_prompt(principal, parsed)
    tokens = reserved_tokens(principal, parsed)
    if principal.limits.monthly_spend_budget is not None:
        spend = await accounting.reservation_spend_nano(
            target=target, tier=principal.limits.tier, prompt_estimate=prompt,
            allowance=tokens, at=dt.datetime.now(dt.UTC), batch=batch, embeddings=embeddings,
        )
    plan = LimitPlan(principal.tenant_id, request_id, principal.limits, tokens, spend)
    remembered = refusals.recall(plan)  # a tenant out of requests per minute: no limiter round trip
    if remembered is not None:
        raise refusal(remembered, principal.tenant_slug, plan.tokens)
    # A flooding tenant's requests ask in turn; all of a tenant's, where the limiter serialises them anyway.
    async with refusals.one_at_a_time(principal.tenant_id, always=get_limiter().in_turn):
        return await _ask_limiter(principal, plan)


async def _ask_limiter(principal: KeyPrincipal, plan: LimitPlan):
    remembered = refusals.recall(plan)  # the one ahead in turn may have been refused meanwhile
    if remembered is not None:
        raise refusal(remembered, principal.tenant_slug, plan.tokens)
    limiter = get_limiter()
    period = period_start()
    asked_at = time.monotonic()
    decision = await limiter.reserve(plan)
    if decision is None:  # no counter for this month (a new month, or Redis lost it): seed from the ledger
        # Spend is counted only under a spend budget (only then are requests priced at admission).
        seed = await _budget_seed(principal.tenant_id, period, principal.limits.monthly_spend_budget is not None)
        decision = await limiter.reserve(plan, seed=seed)
    if not decision.allowed:
        refusals.remember(plan, decision, asked_at)
        raise refusal(decision, principal.tenant_slug, plan.tokens)
    return plan, period, decision


_seeding: SingleFlight = SingleFlight()  # (tenant, month, spend) -> the seed being summed


async def _budget_seed(tenant_id: int, period: dt.date, with_spend: bool):
    """The month's seed, computed once for the requests of a tenant that ask at the same time: the
    first of a month (or after Redis lost its counters) each found no counter, and each summing the
    ledger was a burst of the same aggregate queries. One seed serves them all: the limiter creates the
    counter from the first one it is given and ignores the rest (the counter exists by then)."""
    return await _seeding.run((tenant_id, period, with_spend),
                              lambda: accounting.budget_seed(tenant_id, period, with_spend=with_spend))


async def open_upstream(
    raw: bytes, parsed: parsing.ParsedRequest, principal: KeyPrincipal, request_id: str, meter: Meter,
    timing: ServerTiming | None = None,
) -> tuple[Worker, httpx.Response]:
    """Send to the best worker; on a connection failure before the first byte, try another. The usage
    journal's row (or its move to the next worker) is written while the worker starts, and is durable
    before the response is handed back: nothing of the answer reaches the client before it."""
    registry = get_registry()
    key = parsing.affinity_key(parsed, principal.cache_salt)
    prefix = prefix_key(prompt_text(parsed.kind, parsed.body), principal.cache_salt, parsed.model)
    shared = await registry.shared_matches(parsed.model, prefix)  # other gateways' routing; None: ours alone
    body = parsing.upstream_body(raw, parsed)
    path = UPSTREAM_PATHS[parsed.kind]
    headers = {
        "Content-Type": "application/json",
        "X-Request-Id": request_id,
        "X-Tenant-Id": principal.tenant_slug,
        "X-Priority": str(principal.limits.priority),
        "X-Tenant-Weight": str(principal.limits.fair_share_weight),  # the tier's share of its priority
        "X-Cache-Salt": principal.cache_salt,
        "X-Tessera-Accounting": "1",  # its cumulative counts on every stream event
        **upstream.worker_auth_headers(),
    }
    if exact(principal.limits):
        headers["X-Token-Allowance"] = str(meter.plan.tokens)  # a hard budget: serve at most what was reserved
    client = upstream.client()
    tried: set[str] = set()
    last_error: Exception | None = None
    for _ in range(MAX_ATTEMPTS):
        worker = registry.pick(parsed.model, key, exclude=tried, prefix=prefix, shared=shared)
        if worker is None:
            break
        tried.add(worker.url)
        prefill_url = worker.prefill.get(parsed.model)
        if prefill_url:
            headers["X-Tessera-Prefill-Url"] = prefill_url
        else:
            headers.pop("X-Tessera-Prefill-Url", None)
        # The journal row is written while the worker starts on the request (its commit, behind the
        # writer's other rows, used to come before the worker heard of it: 4 ms of a 25 ms TTFT quiet,
        # up to 25 under a flood); nothing of the answer reaches the client before the row is durable.
        journal_write = asyncio.ensure_future(_journal(meter, parsed, worker.url))
        worker.outstanding += 1
        try:
            req = client.build_request("POST", worker.url + path, content=body, headers=headers)
            response = await _send_while_journaling(client, req, journal_write)
        except RETRYABLE as exc:
            worker.outstanding -= 1
            worker.mark_failed()
            last_error = exc
            await _durable(journal_write)  # the next attempt moves the row: once it is written (else: 503)
            log.warning("worker failed before first byte; retrying", extra={"request_id": request_id, "worker": worker.url, "error": repr(exc)})
            continue
        except BaseException:
            worker.outstanding -= 1
            await _written(journal_write)  # cancelled: the row settles before the meter finishes the request
            raise
        if response.status_code == 503 and len(tried) < MAX_ATTEMPTS:  # worker not ready: try another
            await response.aclose()
            worker.outstanding -= 1
            worker.ready = False
            await _durable(journal_write)
            continue
        if timing is not None:
            timing.mark("upstream")
        try:
            await _durable(journal_write)
        except BaseException:
            await response.aclose()  # the worker sees its client leave and stops; the client gets the 503
            worker.outstanding -= 1
            raise
        if timing is not None:
            timing.mark("journal")
        return worker, response
    if last_error is not None:
        raise ApplicationError("No worker could be reached for this request.", code="upstream_unavailable", status=502)
    raise ApplicationError(
        f"No ready worker serves `{parsed.model}` right now. Please retry shortly.",
        code="model_unavailable", status=503, headers={"Retry-After": "1"},
    )


async def handle(request: HttpRequest, kind: str, *, body: bytes | None = None,
                 principal: KeyPrincipal | None = None, request_id: str | None = None,
                 batch_id: str = "", batch_line: str = "") -> HttpResponse:
    """`body` and `principal` let another front (responses_api.py) send its own translation of the
    request, for a caller it has already authenticated, through the same limits and meter."""
    raw = request.body if body is None else body
    # A batch line (controlplane/batches) brings its attempt's id and the line's ledger identity
    # (`batch_line`: the ledger bills the line once, whichever attempt), and its usage is marked with the
    # batch (its own price line).
    request_id = request_id or new_request_id()
    started = time.perf_counter()
    created_at = dt.datetime.now(dt.UTC)
    extra_headers: dict[str, str] = {}
    meter: Meter | None = None
    tier = ""
    timing = ServerTiming(started)
    try:
        principal = principal or await authenticate(request)
        tier = principal.limits.tier
        # Its writes wait their turn by its tier; a batch line's, like its engine steps, after online work.
        write_priority.current.set(write_priority.BACKGROUND if batch_id else principal.limits.priority)
        timing.mark("auth")
        parsed, target = await checked(principal, raw, kind)
        timing.mark("checks")
        plan, period, decision = await reserve(principal, parsed, target, request_id, batch=bool(batch_id))
        timing.mark("limits")
        extra_headers = ratelimit_headers(decision)
        meter = Meter(request_id, principal, target, plan, period, created_at, started, batch_id=batch_id,
                      batch_line=batch_line, embeddings=parsed.kind == "embeddings")
        renewal.hold(meter)  # renewed until it is finished, however long it runs
        meter.logs_content = content_log.request(principal, request_id, raw)
        worker, response = await open_upstream(raw, parsed, principal, request_id, meter, timing)
        extra_headers["Server-Timing"] = timing.header(response.headers.get("server-timing"))
    except ApplicationError as exc:
        if meter is not None:
            meter.finish(status="error", http_status=exc.status)
        elif tier and exc.status == 429:
            slo_metrics.observe_rejection(tier=tier, reason=slo_metrics.rejection_reason(exc.code, exc.type))
        return error_response(exc, request_id, extra_headers)
    except Exception as exc:
        error = outages.unavailable(exc, request_id)  # PostgreSQL or Redis unreachable: 503, not 500
        if error is None:
            log.exception("gateway error", extra={"request_id": request_id})
            error = ApplicationError("The gateway had an internal error.", code="internal_error", status=500)
        if meter is not None:
            meter.finish(status="error", http_status=error.status)
        return error_response(error, request_id, extra_headers)
    except BaseException:
        if meter is not None:
            # Cancelled (the client left; a non-streamed answer's headers come only when it is done) or a
            # bug: bill what the worker generated before the connection dropped, release the rest.
            resolve = _resolver(meter.worker_url, request_id, None) if meter.worker_url else None
            meter.finish(status="partial", http_status=499, resolve=resolve)
        raise
    if parsed.stream and response.status_code == 200:
        return _streaming(response, worker, parsed, meter, request_id, extra_headers)
    return await _buffered(response, worker, parsed, meter, request_id, extra_headers)


async def _journal(meter: Meter, parsed: parsing.ParsedRequest, worker_url: str) -> None:
    """Write (or, on a retry, move) the request's usage-journal row; 503 if the database cannot take it."""
    try:
        if meter.journaled:
            await usage_writer.move(meter.request_id, worker_url)
        else:
            await usage_writer.admit(journal.Admission(
                request_id=meter.request_id, tenant_id=meter.principal.tenant_id, api_key_id=meter.principal.key_id,
                model=meter.target.base, adapter=meter.target.adapter, tier=meter.principal.limits.tier,
                prompt_estimate=reserved_prompt(meter.principal, parsed), reserved_tokens=meter.plan.tokens,
                reserved_spend_nano=meter.plan.spend_nano, period_start=meter.period, worker_url=worker_url,
                created_at=meter.created_at, batch_id=meter.batch_id, embeddings=meter.embeddings,
                batch_line=meter.batch_line,
            ))
    except Exception as exc:
        log.error("usage journal unavailable; refusing the request", extra={"request_id": meter.request_id,
                                                                            "error": repr(exc)})
        raise ApplicationError(
            "The platform cannot record usage right now, so it is not serving. Please retry shortly.",
            code="usage_unavailable", status=503, type="server_error", headers={"Retry-After": "5"},
        ) from exc
    meter.journaled = True
    meter.worker_url = worker_url


async def _send_while_journaling(client: httpx.AsyncClient, req: httpx.Request,
                                 journal_write: asyncio.Future) -> httpx.Response:
    """The worker's response (its headers), sent while the journal row is written. A row that fails
    first cuts the send short (the worker sees its client leave and stops) and raises its 503: a
    database and spool both away must not leave the workers generating answers nobody will get."""
    sending = asyncio.ensure_future(client.send(req, stream=True))
    try:
        await asyncio.wait((sending, journal_write), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await _discard(sending)
        raise
    if not sending.done() and journal_write.exception() is not None:
        await _discard(sending)
        journal_write.result()  # its ApplicationError (503 usage_unavailable)
    return await sending


async def _discard(sending: asyncio.Future) -> None:
    """Stop a send to a worker: cancelled, or its response closed if it came just before (no
    connection left open, no error left unread)."""
    sending.cancel()
    await asyncio.wait((sending,))
    if not sending.cancelled() and sending.exception() is None:  # (reading it: no error left unread)
        await sending.result().aclose()


async def _durable(journal_write: asyncio.Future) -> None:
    """Wait for the journal write (its 503 raised); a request cancelled meanwhile lets it finish first,
    so that the meter finishing the request finds the row written (and the worker to ask) or failed."""
    try:
        await asyncio.shield(journal_write)
    except asyncio.CancelledError:
        await _written(journal_write)
        raise


async def _written(journal_write: asyncio.Future) -> None:
    """Wait for a journal write whatever its outcome."""
    try:
        await asyncio.shield(journal_write)
    except ApplicationError:
        pass


def _resolver(worker_url: str, request_id: str, fallback: WorkerCounts | None):
    """The request's final counts as the worker reports them once it has dropped the request; zero when
    it never had it; else (it cannot be asked) its counts at the last relayed event, or None: the
    sweeper's job."""

    async def resolve() -> WorkerCounts | None:
        answer = await worker_usage.ask(worker_url, request_id, wait=USAGE_QUERY_WAIT)
        if answer is None or answer.state == "running":
            return fallback
        if answer.state == "unknown":
            return fallback or WorkerCounts(0, 0, 0)
        return answer.counts

    return resolve


def _finish_response(response: HttpResponse, upstream_response: httpx.Response, request_id: str, headers: dict) -> HttpResponse:
    for name in PASS_HEADERS:
        if name in upstream_response.headers:
            response[name] = upstream_response.headers[name]
    for name, value in headers.items():
        response[name] = value
    response["x-request-id"] = request_id
    return response


async def _buffered(upstream_response, worker, parsed, meter: Meter, request_id: str, headers: dict) -> HttpResponse:
    status = "error"
    http_status: int | None = upstream_response.status_code
    counts = None
    resolve = None
    try:
        content = await upstream_response.aread()
        if upstream_response.status_code == 200:
            try:
                counts = usage_counts(orjson.loads(content).get("usage"))
            except (ValueError, AttributeError, TypeError):
                counts = None
            status = "ok"
            if counts is None:  # a 200 without a readable usage object: ask the worker
                resolve = _resolver(worker.url, request_id, None)
    except httpx.HTTPError as exc:  # the worker went away before its answer was complete: nothing served
        log.warning("upstream failed before its answer was complete", extra={"request_id": request_id, "error": repr(exc)})
        content, http_status = None, 502
    except BaseException:
        # The client left (the view is cancelled): the worker aborts when its connection drops; bill
        # what it generated until then, as it reports it.
        status, http_status = "partial", 499
        resolve = _resolver(worker.url, request_id, None)
        raise
    finally:
        worker.outstanding -= 1
        await _close_quietly(upstream_response)
        prompt, cached, completion = counts or (0, 0, 0)
        latency = (time.perf_counter() - meter.started) * 1000
        meter.finish(
            status=status, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
            ttft_ms=latency if completion else None, http_status=http_status, resolve=resolve,
        )
        if counts is not None and meter.logs_content:
            content_log.completion(meter.principal, request_id, content)
    if content is None:
        error = ApplicationError("The upstream worker failed before its answer was complete.",
                                 code="upstream_error", status=502, type="server_error")
        return error_response(error, request_id, headers)
    return _finish_response(HttpResponse(content, status=upstream_response.status_code), upstream_response, request_id, headers)


def _streaming(upstream_response, worker, parsed, meter: Meter, request_id: str, headers: dict) -> StreamingHttpResponse:
    stream = StreamMeter(kind=parsed.kind, strip_usage=not parsed.wants_usage, keep_text=meter.logs_content)
    state = {"closed": False, "broken": False}

    async def close() -> None:
        if state["closed"]:
            return
        state["closed"] = True
        worker.outstanding -= 1
        # Closing the upstream response drops the worker connection, which cancels the request there.
        await _close_quietly(upstream_response)
        counts = usage_counts(stream.usage)
        # [DONE] relayed is a whole answer even when the client (the openai SDK does) closes before the
        # worker's body ends: feed() and the yield of its bytes have no await between them, so a relay
        # closed with `stream.done` set was closed at or after handing [DONE] on.
        ok = stream.done and stream.error is None and not state["broken"]
        resolve = None
        if counts is not None and ok:
            prompt, cached, completion = counts
        else:
            # Partial (the client left, the stream broke, an in-band error): the worker's own counts,
            # asked for once it has aborted; its counts at the last relayed event if it cannot answer.
            last = stream.worker_counts
            prompt, cached, completion = (last.prompt_tokens, last.cached_tokens, last.completion_tokens) if last else (0, 0, 0)
            resolve = _resolver(worker.url, request_id, last)
        ttft = (stream.first_token_at - meter.started) * 1000 if stream.first_token_at else None
        status = "ok" if ok else ("error" if stream.error is not None else "partial")
        # What the client got: a stream that broke (in-band error, worker gone) is the platform's failure.
        http_status = 200 if ok else (500 if stream.error is not None or state["broken"] else 499)
        meter.finish(status="error" if state["broken"] else status, prompt_tokens=prompt, cached_tokens=cached,
                     completion_tokens=completion, ttft_ms=ttft, http_status=http_status, itl_ms=stream.mean_itl_ms(),
                     resolve=resolve)
        if stream.text is not None:
            content_log.completion(meter.principal, request_id, "".join(stream.text))

    async def relay():
        try:
            async for chunk in upstream_response.aiter_raw():
                out = stream.feed(chunk)
                if out:
                    yield out
            rest = stream.flush()
            if rest:
                yield rest
        except httpx.HTTPError as exc:  # the worker went away mid-stream: tell the client, in-band
            state["broken"] = True
            log.warning("upstream stream broke", extra={"request_id": request_id, "error": repr(exc)})
            yield b'data: {"error": {"message": "The upstream worker failed mid-stream.", "type": "server_error", "code": "upstream_error"}}\n\n'
        finally:
            await close()

    body = relay()
    # A generator that is never started (client gone between the view and the first byte) never
    # runs its finally: release the reservation and the connection when it is collected instead.
    loop = asyncio.get_running_loop()
    weakref.finalize(body, lambda: loop.is_closed() or loop.call_soon_threadsafe(lambda: accounting.spawn(close())))
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response.relay = body  # closed by a front that re-frames the events (responses_api.py), which meters
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return _finish_response(response, upstream_response, request_id, headers)


async def _close_quietly(response: httpx.Response) -> None:
    if response.is_closed:
        return
    try:
        await response.aclose()
    except BaseException:  # noqa: BLE001  (cancelled or already broken: nothing more to do)
        pass
