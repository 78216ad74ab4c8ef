"""Prefill and decode on two real worker processes: the decode worker's answers are the unified worker's
(greedy with logprobs, seeded), counted once, and a prefill worker that refuses, dies, or dies mid-stream
costs a recompute on the decode worker, never a lost or wrong request."""

from __future__ import annotations

import hashlib
import http.server
import signal
import struct
import threading
import zlib

import httpx
import openai
import pytest

from dataplane.kv_cache.transfer import MAGIC, VERSION

from .process import MODEL, TOKEN, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.model]

F32_BLOCK = 16 * 2 * 30 * 3 * 64 * 4  # SmolLM2, float32: 16 tokens x K and V x 30 layers x 3 heads x 64
PROMPTS = [f"Field notes, entry {i}. " + f"The {animal} was seen again near the water at dawn. " * 14
           for i, animal in enumerate(("heron", "otter", "kingfisher", "beaver"))]


def complete(w: WorkerProcess, prompt: str, **kw):
    client = openai.OpenAI(base_url=w.url + "/v1", api_key=TOKEN, max_retries=0, timeout=120)
    args = {"max_tokens": 8, "temperature": 0, "logprobs": 2, **kw}
    return client.completions.create(model=MODEL, prompt=prompt, **args)


def same(a, b) -> None:
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.prompt_tokens == b.usage.prompt_tokens and a.usage.completion_tokens == b.usage.completion_tokens
    if a.choices[0].logprobs is not None:
        la, lb = a.choices[0].logprobs.token_logprobs, b.choices[0].logprobs.token_logprobs
        assert la == pytest.approx(lb, abs=1e-3)


def decode_worker(prefill_url: str, *extra: str) -> WorkerProcess:
    return WorkerProcess("--dtype", "float32", "--kv-offload-size", "128MiB", "--prefill-url", prefill_url,
                         "--prefill-min-tokens", "64", "--prefill-timeout", "20", "--no-load-curve", *extra)


def outcomes(w: WorkerProcess) -> dict[str, float]:
    m = w.metrics()
    return {o: m.get(f'tessera:disagg_prefill_requests_total{{model_name="{MODEL}",outcome="{o}"}}', 0.0)
            for o in ("ok", "partial", "failed")}


def test_decode_worker_answers_as_a_unified_worker_and_survives_its_prefill_worker():
    prefill = WorkerProcess("--dtype", "float32", "--no-load-curve")
    decode = None
    try:
        prefill.wait_ready()
        want = [complete(prefill, p) for p in PROMPTS]  # unified serving, for reference
        seeded_want = complete(prefill, PROMPTS[0], temperature=0.9, seed=11, logprobs=None)
        decode = decode_worker(prefill.url)
        decode.wait_ready()
        for p, w in zip(PROMPTS[:3], want[:3], strict=True):
            same(complete(decode, p), w)
        same(complete(decode, PROMPTS[0], temperature=0.9, seed=11, logprobs=None), seeded_want)
        m = decode.metrics()
        assert outcomes(decode) == {"ok": 4, "partial": 0, "failed": 0}
        received = m["tessera:disagg_blocks_received_total"]
        assert received >= 3 * 8  # each prompt's full blocks but the last came from the prefill worker
        assert m["tessera:disagg_bytes_received_total"] == received * F32_BLOCK
        # The repeat found its blocks held here: nothing was sent twice.
        assert m["tessera:kv_offload_loaded_blocks_total"] >= received
        # The decode worker computed only each prompt's last block (and the seeded repeat's last token).
        assert m["tessera:prompt_tokens_total"] < sum(w.usage.prompt_tokens for w in want[:3]) / 4
        short = complete(decode, "Hello there")  # under --prefill-min-tokens: served here alone
        assert short.usage.completion_tokens == 8 and outcomes(decode)["ok"] == 4

        prefill.proc.send_signal(signal.SIGKILL)  # the prefill worker is gone
        prefill.proc.wait(10)
        same(complete(decode, PROMPTS[3]), want[3])
        assert outcomes(decode) == {"ok": 4, "partial": 0, "failed": 1}
    finally:
        prefill.stop()
        if decode is not None:
            decode.stop()


class _DiesMidStream(http.server.BaseHTTPRequestHandler):
    """A prefill worker that sends a valid header and one block (under a hash that is not the prompt's),
    then dies inside the second."""

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        layout = bytes.fromhex(httpx.Response(200, content=body).json()["layout"])
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tessera-kv")
        self.end_headers()
        payload = b"\x01" * F32_BLOCK
        self.wfile.write(struct.pack("<4sB16sII", MAGIC, VERSION, layout, F32_BLOCK, 3))
        self.wfile.write(hashlib.sha256(b"not this prompt").digest() + struct.pack("<I", zlib.crc32(payload)) + payload)
        self.wfile.write(b"\x00" * 1000)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


def test_a_prefill_worker_dying_mid_stream_costs_a_recompute():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DiesMidStream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    unified = WorkerProcess("--dtype", "float32", "--no-load-curve")
    decode = decode_worker(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        unified.wait_ready()
        decode.wait_ready()
        for p in PROMPTS[:2]:
            same(complete(decode, p), complete(unified, p))
        # the one block that came whole has a hash that is not the prompt's: refused, not kept
        assert outcomes(decode) == {"ok": 0, "partial": 0, "failed": 2}
        assert decode.metrics()["tessera:disagg_blocks_received_total"] == 0
        assert decode.metrics()["tessera:kv_offload_blocks"] == 0
    finally:
        server.shutdown()
        unified.stop()
        decode.stop()


def test_the_prefill_route_checks_its_caller_and_its_input():
    w = WorkerProcess("--dtype", "float32", "--no-load-curve")
    try:
        w.wait_ready()
        url = w.url + "/tessera/v1/kv/prefill"
        assert httpx.post(url, json={}).status_code == 401
        bad = [b"not json", b"[]", b'{"token_ids": [], "layout": "00"}', b'{"token_ids": [1, -2], "layout": "00"}',
               b'{"token_ids": [1, 2], "layout": 5}', b'{"token_ids": [1, 2], "skip_blocks": -1, "layout": "00"}',
               b'{"token_ids": [1, 2], "cache_salt": "a\\u0000b", "layout": "00"}']
        for body in bad:
            r = httpx.post(url, content=body, headers=w.headers)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", body
        r = httpx.post(url, json={"token_ids": [1, 2, 3], "layout": "00" * 16}, headers=w.headers)
        assert r.status_code == 409 and r.json()["error"]["code"] == "layout_mismatch"
        assert httpx.get(w.url + "/tessera/v1/kv/layout").status_code == 401
        layout = httpx.get(w.url + "/tessera/v1/kv/layout", headers=w.headers).json()
        assert layout["block_bytes"] == F32_BLOCK and len(bytes.fromhex(layout["layout"])) == 16
        r = httpx.post(url, json={"token_ids": [1, 2], "layout": layout["layout"]},
                       headers={**w.headers, "X-Priority": "high"})
        assert r.status_code == 400 and "X-Priority" in r.json()["error"]["message"]
        vocab = httpx.post(url, json={"token_ids": [1, 10**9], "layout": layout["layout"]}, headers=w.headers)
        assert vocab.status_code == 400 and "token ids" in vocab.json()["error"]["message"]
        ok = httpx.post(url, json={"token_ids": list(range(100, 140)), "layout": layout["layout"]}, headers=w.headers)
        assert ok.status_code == 200 and ok.headers["x-tessera-kv-blocks"] == "2"  # 40 tokens: 2 full blocks
    finally:
        w.stop()


def test_the_gateway_can_name_the_prefill_worker_per_request():
    """A managed serving replica has no --prefill-url: the gateway names its deployment's prefill replica with
    each request (X-Tessera-Prefill-Url). A worker without a second tier computes the prompt itself."""
    prefill = WorkerProcess("--dtype", "float32", "--no-load-curve")
    serving = WorkerProcess("--dtype", "float32", "--kv-offload-size", "64MiB", "--prefill-min-tokens", "64",
                            "--no-load-curve")
    try:
        prefill.wait_ready()
        serving.wait_ready()
        want = complete(prefill, PROMPTS[1])
        body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0, "logprobs": 2}
        named = {**serving.headers, "X-Tessera-Prefill-Url": prefill.url}
        got = httpx.post(serving.url + "/v1/completions", json=body, headers=named, timeout=120).json()
        assert got["choices"][0]["text"] == want.choices[0].text
        assert got["usage"]["prompt_tokens"] == want.usage.prompt_tokens
        assert outcomes(serving)["ok"] == 1, outcomes(serving)
        assert serving.metrics()["tessera:disagg_blocks_received_total"] >= 8
        # the prefill worker has no second tier: named a prefill worker, it serves the prompt itself
        body["prompt"] = PROMPTS[2]
        alone = httpx.post(prefill.url + "/v1/completions", json=body,
                           headers={**prefill.headers, "X-Tessera-Prefill-Url": serving.url}, timeout=120)
        assert alone.status_code == 200 and outcomes(prefill) == {"ok": 0, "partial": 0, "failed": 0}
    finally:
        prefill.stop()
        serving.stop()
