"""A local stand-in for Stripe's HTTP API, for tests only (Stripe itself cannot be reached here).

The official `stripe` SDK is pointed at it (StripeClient base_addresses), so requests go through
the real SDK: form encoding, headers, its own network retries. The server records every request
and behaves like Stripe where our code depends on it:

* Idempotency-Key: a repeated key with the same method, path and body replays the first response
  (with `Idempotent-Replayed: true`); the same key with a different body is a 400 idempotency_error.
* Billing meter events: `identifier` must be unique; a second event with the same identifier
  under a different key counts as a duplicate (recorded, and answered 400 like Stripe's dedupe).
* Failure injection: `fail(path_prefix, times, status, after_processing)` answers 5xx either
  before doing anything or after applying the request (the response is lost, the effect is not),
  which is what a retry must survive without duplicating.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from urllib.parse import parse_qsl


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    params: dict[str, str]
    status: int = 0
    replayed: bool = False


@dataclass
class _Failure:
    path_prefix: str
    times: int
    status: int
    after_processing: bool
    match: Callable[[dict[str, str]], bool] | None = None


@dataclass
class FakeStripeState:
    requests: list[Recorded] = field(default_factory=list)
    customers: dict[str, dict] = field(default_factory=dict)
    invoices: dict[str, dict] = field(default_factory=dict)
    invoice_items: dict[str, dict] = field(default_factory=dict)
    meter_events: dict[str, dict] = field(default_factory=dict)  # identifier -> event
    duplicate_meter_events: list[str] = field(default_factory=list)
    idempotency: dict[str, tuple[str, str, str, int, dict]] = field(default_factory=dict)
    failures: list[_Failure] = field(default_factory=list)


class FakeStripe:
    def __init__(self) -> None:
        self.state = FakeStripeState()
        self._ids = count(1)
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeStripe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail(
        self, path_prefix: str, *, times: int = 1, status: int = 500, after_processing: bool = False,
        match: Callable[[dict[str, str]], bool] | None = None,
    ) -> None:
        """Answer the next `times` matching POSTs with `status` (before or after applying them)."""
        self.state.failures.append(_Failure(path_prefix, times, status, after_processing, match))

    def forget_idempotency_keys(self) -> None:
        """What Stripe does after 24 hours."""
        self.state.idempotency.clear()

    def posts(self, path_prefix: str = "") -> list[Recorded]:
        return [r for r in self.state.requests if r.method == "POST" and r.path.startswith(path_prefix)]

    # --- request handling (called under the lock) ---------------------------------------------

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):06d}"

    def _take_failure(self, path: str, params: dict[str, str]) -> _Failure | None:
        for failure in self.state.failures:
            if not path.startswith(failure.path_prefix) or failure.times <= 0:
                continue
            if failure.match is None or failure.match(params):
                failure.times -= 1
                return failure
        return None

    def handle(self, method: str, path: str, headers: dict[str, str], body: str) -> tuple[int, dict, dict]:
        with self._lock:
            params = dict(parse_qsl(body, keep_blank_values=True))
            record = Recorded(method, path, headers, params)
            self.state.requests.append(record)
            key = headers.get("idempotency-key", "")
            if method == "POST" and key in self.state.idempotency:
                first_method, first_path, first_body, status, response = self.state.idempotency[key]
                if (first_method, first_path, first_body) != (method, path, body):
                    record.status = 400
                    return 400, _error("idempotency_error", f"Keys for idempotent requests can only be used with the same parameters ({key})."), {}
                record.status, record.replayed = status, True
                return status, response, {"Idempotent-Replayed": "true"}
            failure = self._take_failure(path, params)
            if failure is not None and not failure.after_processing:
                record.status = failure.status
                return failure.status, _error("api_error", "injected failure"), _retry_header(failure.status)
            status, response = self._route(method, path, params)
            if method == "POST" and key and status < 500:
                self.state.idempotency[key] = (method, path, body, status, response)
            if failure is not None:  # processed, but the client never hears about it
                record.status = failure.status
                return failure.status, _error("api_error", "injected failure after processing"), _retry_header(failure.status)
            record.status = status
            return status, response, {}

    def _route(self, method: str, path: str, params: dict[str, str]) -> tuple[int, dict]:
        parts = path.strip("/").split("/")
        if method == "POST" and path == "/v1/customers":
            customer = {"id": self._new_id("cus"), "object": "customer", "name": params.get("name"),
                        "metadata": _nested(params, "metadata")}
            self.state.customers[customer["id"]] = customer
            return 200, customer
        if method == "POST" and path == "/v1/billing/meter_events":
            identifier = params.get("identifier", "")
            if identifier in self.state.meter_events:
                self.state.duplicate_meter_events.append(identifier)
                return 400, _error("invalid_request_error", f"An event with identifier {identifier} already exists.")
            event = {"object": "billing.meter_event", "identifier": identifier, "event_name": params.get("event_name"),
                     "timestamp": int(params.get("timestamp", 0)), "payload": _nested(params, "payload")}
            self.state.meter_events[identifier] = event
            return 200, event
        if method == "POST" and path == "/v1/invoices":
            invoice = {"id": self._new_id("in"), "object": "invoice", "status": "draft", "customer": params.get("customer"),
                       "currency": params.get("currency"), "total": 0, "metadata": _nested(params, "metadata"),
                       "collection_method": params.get("collection_method")}
            self.state.invoices[invoice["id"]] = invoice
            return 200, invoice
        if method == "POST" and path == "/v1/invoiceitems":
            invoice = self.state.invoices.get(params.get("invoice", ""))
            if invoice is None or invoice["status"] != "draft":
                return 400, _error("invalid_request_error", "invoice is not a draft")
            item = {"id": self._new_id("ii"), "object": "invoiceitem", "invoice": invoice["id"],
                    "amount": int(params["amount"]), "currency": params.get("currency"),
                    "description": params.get("description"), "metadata": _nested(params, "metadata")}
            self.state.invoice_items[item["id"]] = item
            invoice["total"] += item["amount"]
            return 200, item
        if method == "POST" and len(parts) == 4 and parts[:2] == ["v1", "invoices"] and parts[3] in ("finalize", "void"):
            invoice = self.state.invoices.get(parts[2])
            if invoice is None:
                return 404, _error("invalid_request_error", "no such invoice")
            if parts[3] == "finalize":
                if invoice["status"] != "draft":
                    return 400, _error("invalid_request_error", "invoice is already finalized")
                invoice["status"] = "open"
            else:
                invoice["status"] = "void"
            return 200, dict(invoice)
        return 404, _error("invalid_request_error", f"unrecognized request URL ({method} {path})")


def _nested(params: dict[str, str], name: str) -> dict[str, str]:
    prefix = f"{name}["
    return {k[len(prefix):-1]: v for k, v in params.items() if k.startswith(prefix) and k.endswith("]")}


def _retry_header(status: int) -> dict[str, str]:
    return {"Stripe-Should-Retry": "true"} if status >= 500 else {}


def _error(kind: str, message: str) -> dict:
    return {"error": {"type": kind, "message": message}}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeStripe

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        path, _, query = self.path.partition("?")
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, payload, extra = self.fake.handle(self.command, path, headers, body or query)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", f"req_{id(payload)}")
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args) -> None:  # keep test output quiet
        pass
