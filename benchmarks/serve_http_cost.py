"""The HTTP path's own CPU cost per streamed token, with a scripted engine (no model).

    python -m benchmarks.serve_http_cost [--streams 32] [--tokens 200]

A child process runs the worker's real HTTP stack (`dataplane.worker.routes` on uvicorn) in front
of a scripted engine that yields one token per request every 5 ms; the load generator streams
from it. What the worker process and the load generator spend per token is then everything the
HTTP path adds on top of the engine (parse, render, SSE send, metrics; the client's read), and
it is measured in CPU time, which other users' load on a shared machine barely moves. Divided by
the engine's own CPU per token (from `benchmarks.serve`'s direct runs) it bounds the throughput
the HTTP path can cost when both share the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

MODEL = "smollm2-135m-instruct"


class ScriptedEngine:
    """The part of AsyncLLM the worker uses; one token per request every `interval` seconds."""

    def __init__(self, tokenizer, interval: float) -> None:  # noqa: ANN001
        from dataplane.stats import SchedulerStats

        self.tokenizer = tokenizer
        self.interval = interval
        self.max_model_len = 8192
        self.model_name = MODEL
        self.latest_stats = SchedulerStats(0, 0, 0.0, 0, 0, 0, 0, 0, 1, 1)

    def is_alive(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass

    async def generate(self, prompt, params, *, request_id: str, **_: object):  # noqa: ANN001, ANN201
        from dataplane.outputs import CompletionOutput, RequestOutput

        ids = list(prompt)
        for i in range(params.max_tokens):
            await asyncio.sleep(self.interval)
            last = i == params.max_tokens - 1
            yield RequestOutput(request_id, ids, [CompletionOutput(0, " word", [1178], "length" if last else None)],
                                last)


def serve_scripted(port: int) -> None:
    import uvicorn

    from dataplane.models.registry import resolve_model_path
    from dataplane.models.tokenizer import Tokenizer
    from dataplane.worker.config import WorkerConfig
    from dataplane.worker.routes import WorkerState, create_app

    tokenizer = Tokenizer.from_gguf(resolve_model_path(MODEL), ())
    state = WorkerState(WorkerConfig(model=MODEL), ScriptedEngine(tokenizer, 0.005))
    uvicorn.run(create_app(state), host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def measure(streams: int, tokens: int) -> dict:
    import httpx

    from benchmarks.serve_client import (
        Req,
        closed_loop,
        process_cpu,
        start_worker,
        via_httpx,
        via_raw,
        wait_ready,
    )

    proc, url = start_worker([sys.executable, "-m", "benchmarks.serve_http_cost", "--serve"])
    try:
        wait_ready(url, proc, timeout=60)
        reqs = [Req("Hello", tokens)] * streams
        out = {"streams": streams, "tokens_per_request": tokens}
        async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=256)) as client:
            for name, one in (("raw", lambda r: via_raw(url, {}, r)), ("httpx", lambda r: via_httpx(client, url, r))):
                await closed_loop(one, reqs[:4], 4)  # warm-up
                worker0, client0, t0 = process_cpu(proc.pid), process_cpu(None), time.perf_counter()
                results = await closed_loop(one, reqs, streams)
                n = sum(r.tokens for r in results)
                out[name] = {"worker_us_per_token": 1e6 * (process_cpu(proc.pid) - worker0) / n,
                             "client_us_per_token": 1e6 * (process_cpu(None) - client0) / n,
                             "tokens_per_s": n / (time.perf_counter() - t0),
                             "errors": sum(r.error is not None for r in results)}
                print(f"  {name} client: worker {out[name]['worker_us_per_token']:.0f} us/token, "
                      f"client {out[name]['client_us_per_token']:.0f} us/token", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child process
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve_scripted(args.port)
    else:
        print(asyncio.run(measure(args.streams, args.tokens)))


if __name__ == "__main__":
    main()
