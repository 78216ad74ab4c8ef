"""What a running batch costs the online tiers, and how fast a batch runs on an idle platform.

    python -m benchmarks.batch_impact [--seconds 30] [--rate 1.5] [--lines 64] [--max-tokens 16]

One SmolLM2-135M worker (the load benchmark's flags: 8 seats, the ITL guard for priority 10) behind
the gateway (uvicorn, a throwaway PostgreSQL database). A premium tenant (priority 10) sends streamed chat
requests as Poisson arrivals at `--rate`; a batch tenant's batch is created through /v1/files and
/v1/batches and run by the batch runner (what the `batches.run` Celery task calls) in its own process.

1. Premium alone, `--seconds`: client-side TTFT p95 and ITL p95 (token gaps).
2. The same premium traffic while a batch keeps the worker busy (more lines than it can finish).
   Target: both p95s within 1.1x of (1).
3. Batch throughput with nothing else running: `--lines` requests, created to `completed`
   (completed_at - in_progress_at), against the engine's offline `LLM.chat` on the same requests
   with the worker's scheduler settings and thread count. Target: >= 80 %.

Every request generates exactly `--max-tokens` tokens (`ignore_eos`), so tokens/s compare like for
like. The load generator, gateway, runner and worker share the machine's CPU cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import torch

from benchmarks.common import (
    db_step,
    db_step_process,
    environment,
    fmt,
    run_child,
    stop_processes,
    write_results,
)
from benchmarks.gateway import free_port, wait_http
from benchmarks.load import MODEL, TIERS, WORKER_FLAGS, drive, summarize
from benchmarks.serve import wait_ready
from dataplane.engine.llm import LLM
from dataplane.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
PREMIUM = TIERS[-1]


def prepare(env: dict) -> dict[str, str]:
    return db_step(env, "impact_tenants", model=MODEL, premium=PREMIUM)


@contextlib.contextmanager
def postgres_database(server: str, name: str):
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def conversation(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Write a short note about batch item number {i}."}]


def create_batch(url: str, key: str, lines: int, max_tokens: int, tag: str) -> str:
    data = b"".join(orjson.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": {"model": MODEL, "messages": conversation(i), "max_tokens": max_tokens,
                                           "temperature": 0, "ignore_eos": True}}) + b"\n" for i in range(lines))
    headers = {"Authorization": f"Bearer {key}"}
    uploaded = httpx.post(url + "/v1/files", headers=headers, files={"file": ("in.jsonl", io.BytesIO(data))},
                          data={"purpose": "batch"}, timeout=60).raise_for_status().json()
    batch = httpx.post(url + "/v1/batches", headers=headers, timeout=60, json={
        "input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    return batch.raise_for_status().json()["id"]


def start_runner(env: dict, batch_id: str) -> subprocess.Popen:
    return db_step_process(env, "run_batch", batch_id=batch_id)


def batch(url: str, key: str, batch_id: str) -> dict:
    return httpx.get(f"{url}/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()


def wait_batch(url: str, key: str, batch_id: str, predicate, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while not predicate(current := batch(url, key, batch_id)):
        if time.monotonic() > deadline:
            raise SystemExit(f"batch {batch_id} did not get there: {current}")
        time.sleep(0.25)
    return current


def offline_chat(lines: int, max_tokens: int) -> dict:
    """In a process of its own (run_child): the engine, 1 thread, on the batch's requests -> seconds, tokens."""
    torch.set_num_threads(1)
    llm = LLM(MODEL, max_num_seqs=8, max_num_batched_tokens=256, kv_cache_memory="256MiB")
    convs = [[{"role": "user", "content": f"Write a short note about batch item number {i}."}] for i in range(lines)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    llm.chat(convs[:4], params)
    t = time.perf_counter()
    outs = llm.chat(convs, params)
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}


def offline(lines: int, max_tokens: int) -> dict:
    """The engine alone on the same requests, with the worker's scheduler settings and threads."""
    result = run_child("benchmarks.batch_impact:offline_chat", lines=lines, max_tokens=max_tokens)
    return {**result, "requests_per_s": lines / result["seconds"], "tokens_per_s": result["tokens"] / result["seconds"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="premium traffic per phase")
    p.add_argument("--rate", type=float, default=1.5, help="premium requests/s (capacity is ~3 on 2 cores)")
    p.add_argument("--lines", type=int, default=64, help="lines of the idle-platform batch")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--name", default="batch_impact")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="an extra worker flag (later flags win), e.g. --worker-arg=--background-priority=none "
                        "to measure the engine without its background tier")
    p.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432",
                   help="a PostgreSQL server where a throwaway database is made (SQLite's one writer would make "
                        "the gateway and the batch runner wait on each other's writes)")
    args = p.parse_args()
    flags = ["--dtype=auto", *WORKER_FLAGS, "--background-priority=1000", *args.worker_arg]
    # The engine alone, before the stack starts and after it stops; the faster run is the reference
    # (the cores are shared, so this errs against the batch).
    engine_runs = [offline(args.lines, args.max_tokens)]
    procs: list[subprocess.Popen] = []
    database = f"batch_impact_{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp, postgres_database(args.postgres, database) as database_url:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base", "TESSERA_VAR_DIR": tmp,
               "DATABASE_URL": database_url, "TESSERA_LIMITER": "database", "REDIS_URL": "",
               "TESSERA_LOG_LEVEL": "WARNING", "TESSERA_WORKER_TOKEN": "", "TESSERA_WORKER_POLL_SECONDS": "0.5",
               "CELERY_BROKER_URL": "memory://"}
        try:
            wport, gport = free_port(), free_port()
            worker_url, url = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{gport}"
            procs.append(subprocess.Popen([sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--port",
                                           str(wport), "--log-level", "warning", *flags], env=env, cwd=ROOT))
            keys = prepare(env)
            env["TESSERA_WORKERS"] = worker_url
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host", "127.0.0.1", "--port",
                 str(gport), "--no-access-log", "--log-level", "warning"], cwd=ROOT, env=env))
            wait_ready(worker_url, procs[0])
            wait_http(url + "/metrics")
            premium = {"premium": args.rate}
            asyncio.run(drive(url, keys, premium, 3, args.max_tokens))  # warm-up
            alone = summarize(asyncio.run(drive(url, keys, premium, args.seconds, args.max_tokens)), args.seconds)
            print(f"premium alone: TTFT p95 {fmt(alone['premium']['ttft_p95_ms'], 0)} ms, "
                  f"ITL p95 {fmt(alone['premium']['itl_p95_ms'], 0)} ms", flush=True)

            # More lines than the phase can finish: the batch is running for all of it.
            busy_lines = int(args.seconds * 12) + 100
            busy = create_batch(url, keys["batch"], busy_lines, args.max_tokens, "busy")
            runner = start_runner(env, busy)
            procs.append(runner)
            wait_batch(url, keys["batch"], busy, lambda b: b["status"] == "in_progress", 60)
            time.sleep(3)  # the batch is at its steady state
            before = batch(url, keys["batch"], busy)
            t0 = time.monotonic()
            shared = summarize(asyncio.run(drive(url, keys, premium, args.seconds, args.max_tokens)), args.seconds)
            elapsed = time.monotonic() - t0
            httpx.post(f"{url}/v1/batches/{busy}/cancel", headers={"Authorization": f"Bearer {keys['batch']}"},
                       timeout=30).raise_for_status()
            runner.communicate(timeout=120)
            cancelled = batch(url, keys["batch"], busy)
            busy_done = cancelled["request_counts"]["completed"] - before["request_counts"]["completed"]
            print(f"premium with a batch: TTFT p95 {fmt(shared['premium']['ttft_p95_ms'], 0)} ms, ITL p95 "
                  f"{fmt(shared['premium']['itl_p95_ms'], 0)} ms; batch lines answered meanwhile ~{busy_done}"
                  f" (status {cancelled['status']})", flush=True)

            t0 = time.monotonic()  # from the create call to `completed` seen (polled every 0.25 s)
            idle = create_batch(url, keys["batch"], args.lines, args.max_tokens, "idle")
            runner = start_runner(env, idle)
            procs.append(runner)
            done = wait_batch(url, keys["batch"], idle, lambda b: b["status"] in ("completed", "failed"), 600)
            wall = round(time.monotonic() - t0, 2)
            # The runner's own time, validation to finalize (Python's start-up left out): what a Celery
            # worker, already running, spends on the batch.
            seconds = round(orjson.loads(runner.communicate(timeout=60)[0].strip().splitlines()[-1])["seconds"], 2)
            idle_stats = {"lines": args.lines, "completed": done["request_counts"]["completed"],
                          "failed": done["request_counts"]["failed"], "seconds": seconds, "wall_seconds": wall}
        finally:
            stop_processes(procs, 20)
    engine_runs.append(offline(args.lines, args.max_tokens))
    engine = max(engine_runs, key=lambda r: r["tokens_per_s"])
    idle_stats["requests_per_s"] = idle_stats["completed"] / seconds
    idle_stats["tokens_per_s"] = idle_stats["completed"] * args.max_tokens / seconds
    data = {
        "environment": environment(), "lscpu": lscpu(), "load_average_after": os.getloadavg(), "date": dt.date.today().isoformat(), "model": MODEL,
        "worker_flags": flags, "rate_rps": args.rate, "seconds": args.seconds, "max_tokens": args.max_tokens,
        "premium_alone": alone["premium"], "premium_with_batch": shared["premium"],
        "batch_lines_during_phase": busy_done, "batch_phase_seconds": elapsed,
        "ttft_p95_ratio": ratio(shared, alone, "ttft_p95_ms"), "itl_p95_ratio": ratio(shared, alone, "itl_p95_ms"),
        "batch_idle": idle_stats, "engine_offline": engine, "engine_offline_runs": engine_runs,
        "batch_vs_offline": idle_stats["tokens_per_s"] / engine["tokens_per_s"],
    }
    write_results(args.name, data, table(data))
    print(table(data))


def ratio(shared: dict, alone: dict, key: str) -> float | None:
    a, b = alone["premium"][key], shared["premium"][key]
    return b / a if a and b is not None else None


def lscpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs"


def table(d: dict) -> str:
    a, s, i, e = d["premium_alone"], d["premium_with_batch"], d["batch_idle"], d["engine_offline"]
    return "\n".join([
        "# Batch impact on the online tiers (`python -m benchmarks.batch_impact`)",
        "",
        f"{d['lscpu']}, {d['date']}. One {d['model']} worker ({' '.join(d['worker_flags'])}) behind the gateway; "
        f"premium (priority 10) streams {d['max_tokens']} tokens per request at {d['rate_rps']} req/s (Poisson), "
        f"{d['seconds']:.0f} s per phase; batch lines run at X-Priority 1000. The cores are shared with "
        f"whatever else runs (load average after the run: {', '.join(f'{x:.1f}' for x in d['load_average_after'])}).",
        "",
        "| premium | TTFT p50 / p95 ms | ITL p50 / p95 ms | done |",
        "|---|---|---|---|",
        f"| alone | {fmt(a['ttft_p50_ms'], 0)} / {fmt(a['ttft_p95_ms'], 0)} | {fmt(a['itl_p50_ms'], 0)} / "
        f"{fmt(a['itl_p95_ms'], 0)} | {a['completed']} / {a['sent']} |",
        f"| with a batch running | {fmt(s['ttft_p50_ms'], 0)} / {fmt(s['ttft_p95_ms'], 0)} | {fmt(s['itl_p50_ms'], 0)} / "
        f"{fmt(s['itl_p95_ms'], 0)} | {s['completed']} / {s['sent']} |",
        f"| ratio (target <= 1.1x) | {fmt(d['ttft_p95_ratio'], 2)}x TTFT p95 | {fmt(d['itl_p95_ratio'], 2)}x ITL p95 | |",
        "",
        f"Batch lines answered while premium ran: {d['batch_lines_during_phase']} in {d['batch_phase_seconds']:.0f} s.",
        "",
        "| idle platform | requests | seconds | requests/s | tokens/s |",
        "|---|---|---|---|---|",
        f"| batch (the runner: validation to `completed`) | {i['completed']} of {i['lines']} | {i['seconds']} | "
        f"{fmt(i['requests_per_s'], 2)} | {fmt(i['tokens_per_s'], 1)} |",
        f"| engine offline (`LLM.chat`, same requests, 1 thread; the faster of 2 runs) | {i['lines']} | {fmt(e['seconds'], 1)} | "
        f"{fmt(e['requests_per_s'], 2)} | {fmt(e['tokens_per_s'], 1)} |",
        f"| batch / offline (target >= 80 %) | | | | {fmt(d['batch_vs_offline'] * 100, 0)} % |",
    ])


if __name__ == "__main__":
    main()
