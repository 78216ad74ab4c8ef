"""A free-tier flood against `make run`'s real stack, and what it does to a premium tenant.

    python -m benchmarks.flood [--premium 20] [--premium-tokens 48] [--premium-clients 1]
                               [--configs default:default,default:2] [--rate R]
                               [--flood-priority nice10,idle] [--rounds N]

For each configuration (libgomp's wait policy : the worker's torch threads; `default` leaves either to
make run), the whole local stack (`python -m controlplane.localstack`: uvicorn gateway, Celery, the
real SmolLM2-135M CPU worker, SQLite, the file-system broker) is started in a fresh state folder, a
premium and a free tenant are made with `manage.py tenant_create`, and then:
- quiet: the premium tenant's streamed chat completions, one at a time (from each of
  --premium-clients clients; the issue's tenant had 2), timed to the first content event (TTFT) and
  between content events (ms per token);
- flooded: the same while the free tenant floods the gateway from its own process at `nice 10` (48
  streamed chat completions in flight, each answered one sent again at once; or, with --rate, that
  many a second whatever the answers' speed), as in the issue. The flood lasts until the last
  premium sample is taken, so every flooded sample is one.
Reported: premium TTFT p50/p95 quiet and flooded and their ratio (target ≤ 1.5×), ms per token, the
flood's answers by status (every refusal a 429 with Retry-After; no 5xx), the gateway's CPU per flood
answer, the cores each part used while flooded (gateway, worker, Celery, the flooder, the premium
client, the whole host), and where the slowest tenth of the flooded premium requests waited (their
Server-Timing).

The CPU is recorded; compare only within one run. benchmarks.cpu_contention isolates the engine's part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.common import cpu_seconds, percentile
from benchmarks.gateway_refusals import ttfts

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"


_REASONS = (("Too many concurrent", "concurrency"), ("Rate limit reached for requests", "requests"),
            ("Rate limit reached for tokens", "tokens"), ("Request too large", "too_large"))


def _reason(error: dict) -> str:
    """What refused a 429 (controlplane/gateway/responses.refusal's wording), else its error code."""
    message = error.get("message", "")
    return next((name for prefix, name in _REASONS if message.startswith(prefix)), error.get("code") or "?")


async def _flood(url: str, key: str, concurrency: int, seconds: float, rate: float = 0.0) -> dict:
    """The flooder's body (run in its own process): `concurrency` streamed requests in flight, each
    answered one sent again at once (closed loop); with `rate`, that many a second (open loop)."""
    statuses: Counter = Counter()
    reasons: Counter = Counter()  # the 429s by what refused them
    missing_retry_after = 0
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a joke."}], "max_tokens": 16,
            "stream": True}
    end = time.monotonic() + seconds
    stopped = asyncio.Event()  # SIGTERM: the premium measurement is over
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    started = time.monotonic()

    def going() -> bool:
        return not stopped.is_set() and time.monotonic() < end

    async def send(client: httpx.AsyncClient) -> None:
        nonlocal missing_retry_after
        try:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {key}"}) as r:
                data = b"".join([chunk async for chunk in r.aiter_bytes()]) if r.status_code != 200 else b""
                if r.status_code == 200:
                    async for _ in r.aiter_bytes():
                        pass
                statuses[r.status_code] += 1
                if r.status_code == 429:
                    missing_retry_after += "retry-after" not in r.headers
                    reasons[_reason(json.loads(data).get("error", {}))] += 1
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] += 1

    async def closed_loop(client: httpx.AsyncClient) -> None:
        while going():
            await send(client)

    async def open_loop(client: httpx.AsyncClient) -> None:
        # A fixed arrival rate whatever the answers' speed, so that a cheaper refusal does not bring
        # more load (a closed loop's rate grows as its answers get faster); at most `concurrency` in
        # flight, an arrival beyond that is counted as not sent.
        tasks: set[asyncio.Task] = set()
        next_at = time.monotonic()
        while going():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += 1.0 / rate
            if len(tasks) >= concurrency:
                statuses["not_sent"] += 1
                continue
            task = asyncio.create_task(send(client))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        if rate:
            await open_loop(client)
        else:
            await asyncio.gather(*(closed_loop(client) for _ in range(concurrency)))
    return {"statuses": dict(statuses), "refusals": dict(reasons), "seconds": time.monotonic() - started,
            "missing_retry_after": missing_retry_after}


def _stack(var: Path, port: int, wait: str, threads: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "TESSERA_VAR_DIR": str(var)}
    env.pop("OMP_WAIT_POLICY", None)
    if wait != "default":  # libgomp's own: spin a while, then sleep
        env["OMP_WAIT_POLICY"] = wait.upper()
    if threads != "default":
        env["TESSERA_WORKER_THREADS"] = threads
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.localstack", "--port", str(port),
                             "--worker-port", str(port + 100)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 900
    for line in proc.stdout:
        if line.startswith("TESSERA_URL="):
            return proc, line.split("=", 1)[1].strip().removesuffix("/v1")
        if time.monotonic() > deadline:
            break
    raise RuntimeError("the local stack did not come up")


def _tenant(var: Path, name: str, tier: str) -> str:
    env = {**os.environ, "TESSERA_VAR_DIR": str(var)}
    out = subprocess.run([sys.executable, "manage.py", "tenant_create", "--name", name, "--tier", tier],
                         cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])["api_key"]


_PROCESSES = (("gateway", "uvicorn controlplane.asgi"), ("worker", "dataplane.worker"),
              ("celery", "celery -A controlplane"))


def _stack_pids(proc: subprocess.Popen) -> dict[str, list[int]]:
    """The stack's processes by role: the launcher's descendants (each child has its own process group)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    below, frontier = set(), {proc.pid}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - below
        below |= frontier
    out: dict[str, list[int]] = {role: [] for role, _ in _PROCESSES} | {"other": []}
    for pid in below:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        role = next((r for r, pattern in _PROCESSES if pattern in cmdline), "other")
        out[role].append(pid)
    return out


def _host_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole host since boot (/proc/stat's first line)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, sum(fields) / tick


def _cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def cpu_shares(roles: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of each role, and of the host (`host_busy`, `host_total`)."""
    shares = {role: _cpu_of(pids) for role, pids in roles.items()}
    shares["host_busy"], shares["host_total"] = _host_busy()
    return shares


# How the flooding client is scheduled on this host. `nice10`: as the issue ran it, so the flood's own
# client CPU (0.77 of 2 cores on an AMD EPYC) competes with the stack at a lower weight; `idle`: SCHED_IDLE,
# it runs only on a core nothing else wants, the nearest this one host comes to a flood from other hosts
# (what the server must pay for: the gateway's refusals, stays on the server either way).
FLOOD_PRIORITIES = ("nice10", "idle")


def _flooder_priority(priority: str):
    if priority == "nice10":
        return lambda: os.nice(10)
    return lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def premium_ttfts(url: str, key: str, n: int, tokens: int, clients: int, stages: list[dict[str, float]],
                  itls: list[float], warmup: int) -> list[float]:
    """`n` premium TTFTs (ms) from `clients` clients side by side, each sending one request at a time
    (the issue's premium tenant streamed from 2); samples, stages and ITLs client after client."""
    if clients == 1:
        return ttfts(url, key, MODEL, n, tokens, warmup=warmup, stages=stages, itls=itls)
    shares = [n // clients + (i < n % clients) for i in range(clients)]
    parts: list[tuple[list[float], list[dict[str, float]], list[float]]] = [([], [], []) for _ in shares]

    def client(i: int) -> None:
        samples, st, itl = parts[i]
        samples.extend(ttfts(url, key, MODEL, shares[i], tokens, warmup=warmup, stages=st, itls=itl))

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))  # re-raises a client's error
    out: list[float] = []
    for samples, st, itl in parts:
        out += samples
        stages += st
        itls += itl
    return out


def run_one(wait: str, threads: str, port: int, seconds: float, premium_n: int, concurrency: int,
            rate: float, tokens: int, priority: str = "nice10", clients: int = 1) -> dict:
    var = Path(tempfile.mkdtemp(prefix="tessera-flood-"))
    proc, url = _stack(var, port, wait, threads)
    try:
        premium, free = _tenant(var, "Premium Co", "premium"), _tenant(var, "Free Co", "free")
        quiet_itl: list[float] = []
        quiet_stages: list[dict[str, float]] = []
        quiet = premium_ttfts(url, premium, premium_n, tokens, clients, quiet_stages, quiet_itl, warmup=3)
        web = _stack_pids(proc)["gateway"][0]  # this stack's (a test's gateway may run beside it)
        flooder = subprocess.Popen([sys.executable, "-m", "benchmarks.flood", "--flooder", url,
                                    "--key", free, "--seconds", str(seconds), "--concurrency", str(concurrency),
                                    "--rate", str(rate)],
                                   cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=_flooder_priority(priority))
        time.sleep(2.0)
        roles = {**_stack_pids(proc), "flooder": [flooder.pid], "premium client": [os.getpid()]}
        shares0 = cpu_shares(roles)
        cpu0, t0 = cpu_seconds(web), time.perf_counter()
        stages: list[dict[str, float]] = []
        flooded_itl: list[float] = []
        flooded = premium_ttfts(url, premium, premium_n, tokens, clients, stages, flooded_itl, warmup=0)
        cpu, elapsed = cpu_seconds(web) - cpu0, time.perf_counter() - t0
        shares = {k: v - shares0[k] for k, v in cpu_shares(roles).items()}
        if flooder.poll() is not None:  # every premium sample must have been taken under the flood
            raise RuntimeError(f"the flood ended before the premium measurement did: raise --seconds ({seconds:g})")
        flooder.send_signal(signal.SIGTERM)
        report = json.loads(flooder.communicate(timeout=120)[0].strip().splitlines()[-1])
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(var, ignore_errors=True)
    answered = sum(v for k, v in report["statuses"].items() if k.isdigit())
    rate = answered / report["seconds"]
    q95, f95 = percentile(quiet, 95), percentile(flooded, 95)
    # The flooded samples whose request found the engine idle (scheduled within a millisecond): what the
    # flood's refusals cost on the gateway's path, apart from sharing the engine with the free tier's
    # admitted requests (a step in flight when the premium one arrives: `worker-queue`).
    idle = [t for t, st in zip(flooded, stages, strict=True) if st.get("worker-queue", 0.0) < 1.0]
    return {"wait": wait, "threads": threads, "flood_priority": priority, "quiet_p50": percentile(quiet, 50), "quiet_p95": q95,
            "flooded_p50": percentile(flooded, 50), "flooded_p95": f95, "p95_ratio": f95 / q95,
            "quiet_itl_p50": percentile(quiet_itl, 50), "flooded_itl_p50": percentile(flooded_itl, 50),
            "flooded_itl_p95": percentile(flooded_itl, 95),
            "idle_n": len(idle), "idle_p95": percentile(idle, 95) if idle else None,
            "idle_ratio": percentile(idle, 95) / q95 if idle else None,
            "flood": report, "flood_answers_per_s": rate,
            "gateway_cpu_ms_per_flood_answer": cpu * 1e3 / max(rate * elapsed, 1),
            "slowest": slowest(flooded, stages), "quiet_slowest": slowest(quiet, quiet_stages),
            # every premium sample in order, for a look at which ones were slow and where they waited
            "samples": {"quiet": _samples(quiet, quiet_stages), "flooded": _samples(flooded, stages)},
            # cores in use during the flooded measurement, by role and for the whole host
            "cores_used": {k: v / elapsed for k, v in shares.items() if k != "host_total"},
            "cores_on_host": shares["host_total"] / elapsed}


def _samples(ttfts: list[float], stages: list[dict[str, float]]) -> list[dict[str, float]]:
    """Each premium request in the order sent, its TTFT and Server-Timing stages (ms, to 0.1): which were slow, and when."""
    return [{name: round(ms, 1) for name, ms in {"ttft": t, **st}.items()} for t, st in zip(ttfts, stages, strict=True)]


def slowest(samples: list[float], stages: list[dict[str, float]]) -> dict[str, float]:
    """Where the slowest tenth (two at least) of the premium requests waited: the mean of each
    stage of their Server-Timing (the gateway's, then the worker's `worker-*`, a breakdown of the
    gateway's `upstream`), and the rest of the TTFT after the gateway's stages (the relay) as `relay`."""
    worst = sorted(range(len(samples)), key=samples.__getitem__)[-max(2, len(samples) // 10):]
    names = list(dict.fromkeys(name for i in worst for name in stages[i]))
    means = {name: sum(stages[i].get(name, 0.0) for i in worst) / len(worst) for name in names}
    means["ttft"] = sum(samples[i] for i in worst) / len(worst)
    means["relay"] = means["ttft"] - sum(v for name, v in means.items() if name != "ttft" and not name.startswith("worker-"))
    return means


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0,
                    help="the flood's longest; it stops when the premium measurement ends, which must be first")
    ap.add_argument("--premium", type=int, default=20, help="premium requests timed, quiet and flooded")
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--premium-tokens", type=int, default=48, help="max_tokens of each premium request")
    ap.add_argument("--premium-clients", type=int, default=1,
                    help="premium clients side by side, each one request at a time (the issue's: 2)")
    ap.add_argument("--configs", default="default:default",
                    help="stacks to run, each OMP_WAIT_POLICY:worker threads (`default`: libgomp's own wait, or "
                         "the worker's own thread count), e.g. default:default,passive:default,default:1")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="flood requests a second, whatever the answers' speed (open loop); 0: closed loop")
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--flood-priority", default="nice10",
                    help=f"the flooding client's scheduling, one or several of {', '.join(FLOOD_PRIORITIES)} "
                         "(comma-separated; each configuration runs under each)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every configuration and priority, interleaved")
    ap.add_argument("--flooder", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--key", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flooder:
        print(json.dumps(asyncio.run(_flood(args.flooder, args.key, args.concurrency, args.seconds, args.rate))), flush=True)
        return

    from benchmarks.common import _cpu_name, write_results

    configs = [c.split(":") for c in args.configs.split(",")]
    priorities = args.flood_priority.split(",")
    if unknown := set(priorities) - set(FLOOD_PRIORITIES):
        raise SystemExit(f"--flood-priority: unknown {sorted(unknown)}; use {', '.join(FLOOD_PRIORITIES)}")
    if args.premium_clients < 1:
        raise SystemExit("--premium-clients: at least 1")
    rows = [run_one(w, t, args.port, args.seconds, args.premium, args.concurrency, args.rate, args.premium_tokens, p,
                    args.premium_clients)
            for _ in range(args.rounds) for w, t in configs for p in priorities]
    cpu, when = _cpu_name(), time.strftime("%Y-%m-%d %H:%M")
    lines = [f"# Free-tier flood vs premium TTFT through `make run` ({cpu}, {os.cpu_count()} cores, {when})", "",
             f"`python -m benchmarks.flood --seconds {args.seconds:g} --premium {args.premium} --concurrency "
             f"{args.concurrency} --premium-tokens {args.premium_tokens} --configs {args.configs} --rate {args.rate:g} "
             f"--flood-priority {args.flood_priority} --rounds {args.rounds} --premium-clients {args.premium_clients}`: the real "
             f"stack (SQLite, file-system broker, one SmolLM2 CPU worker); premium streamed chat, max_tokens "
             f"{args.premium_tokens}, from {args.premium_clients} client(s) one request at a time each; worker threads `default`: "
             "make run's choice (cores − 1, controlplane/localstack.py); the flood from its own process "
             "at nice 10 or under SCHED_IDLE (flood priority `idle`: it runs only on a core nothing else wants, the "
             "nearest one host comes to a flood from elsewhere), " + (f"{args.rate:g} streamed requests a second (open loop, at most {args.concurrency} in "
                                 "flight)" if args.rate else f"{args.concurrency} streamed requests in flight (closed loop)")
             + ". The slowest tenth of the premium requests, quiet and flooded: the mean of each gateway stage (their "
             "Server-Timing: the gateway's stages, then the worker's, a breakdown of `upstream`) and of the rest of the "
             "TTFT (the relay). Engine idle at arrival: the flooded premium requests the engine scheduled within 1 ms "
             "(no step in flight), their p95 against quiet: what the flood costs on the gateway's path, apart from "
             "sharing the engine with the free tier's admitted requests.", "",
             "| OMP_WAIT_POLICY | worker threads | flood priority | premium TTFT p50 / p95 quiet (ms) | flooded (ms) | **p95 ×** | "
             "flooded, engine idle at arrival: n, p95 (ms, ×) | "
             "premium ms/token p50 quiet / flooded (p95) | flood answers/s | "
             "flood statuses (429s by reason) | gateway CPU ms per flood answer | cores in use while flooded | "
             "slowest tenth: ms per stage, quiet → flooded |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['wait']} | {r['threads']} | {r['flood_priority']} | {r['quiet_p50']:.0f} / {r['quiet_p95']:.0f} | {r['flooded_p50']:.0f} / "
                     f"{r['flooded_p95']:.0f} | **{r['p95_ratio']:.2f}×** | "
                     + (f"{r['idle_n']}, {r['idle_p95']:.0f} ({r['idle_ratio']:.2f}×)" if r["idle_n"] else "0") + " | "
                     f"{r['quiet_itl_p50']:.0f} / {r['flooded_itl_p50']:.0f} "
                     f"({r['flooded_itl_p95']:.0f}) | {r['flood_answers_per_s']:.0f} | "
                     f"{r['flood']['statuses']} ({r['flood'].get('refusals', {})}; without Retry-After: "
                     f"{r['flood']['missing_retry_after']}) | "
                     f"{r['gateway_cpu_ms_per_flood_answer']:.2f} | "
                     + ", ".join(f"{k} {v:.2f}" for k, v in r["cores_used"].items()) + " | "
                     + ", ".join(f"{k} {r['quiet_slowest'].get(k, 0):.0f} → {v:.0f}" for k, v in r["slowest"].items())
                     + " |")
    if len(rows) > len(configs) * len(priorities):  # several rounds: the spread, which single runs hide
        lines += ["", "Premium TTFT p95 flooded / quiet over the rounds, by flood priority: " + "; ".join(
            f"{p}: median {statistics.median(xs):.2f}× ({min(xs):.2f}–{max(xs):.2f}, {len(xs)} runs)"
            for p in priorities if (xs := [r["p95_ratio"] for r in rows if r["flood_priority"] == p])) + "."]
    write_results("flood", {"cpu": cpu, "cores": os.cpu_count(), "when": when, "rows": rows}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
