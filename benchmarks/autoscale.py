"""Autoscaling on the real stack, as a timeline: load, replicas, premium TTFT p95 and cost per minute.

`python -m benchmarks.autoscale [--step-seconds 150] [--load-clients 6]`: PostgreSQL (a fresh
database), Redis as the broker, the control plane (uvicorn, Celery worker + beat: the reconciler and
its autoscaler), three managed SmolLM2 CPU workers (benchmarks/live_stack.py, what the live tests
run). One deployment, min 1 / max 3 replicas, `--max-num-seqs` 1 (default) so that a few clients make a queue. A
premium tenant streams chat completions one after another the whole time (its TTFT is what the
autoscaler protects); a step of standard-tier load (closed-loop clients) starts after a quiet
baseline and stops after `--step-seconds`; the run ends when the deployment is back at 1 replica.

Autoscaler clocks are shortened as in tests/controlplane/deployments/test_live_autoscale.py (up
cooldown 8 s, down cooldown and stability 15 s, drain 30 s) so a run takes minutes; the decision
is the production function. Results: benchmarks/results/autoscale.{json,md} and two SVG charts.
On a 2-core host three workers, the control plane and the clients share the cores: a second
replica adds queue capacity (seats) more than compute, which is what this run can show.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path

import psycopg

from benchmarks.common import RESULTS, environment, percentile, write_results

DB_NAME = "tessera_bench_autoscale"
BROKER = os.environ.get("TESSERA_BENCH_BROKER_URL", "redis://127.0.0.1:6379/12")
CLOCKS = {"TESSERA_AUTOSCALE_TARGET_WAITING": "1", "TESSERA_AUTOSCALE_LOW_WAITING": "0.5",
          "TESSERA_AUTOSCALE_UP_COOLDOWN_SECONDS": "8", "TESSERA_AUTOSCALE_DOWN_COOLDOWN_SECONDS": "15",
          "TESSERA_AUTOSCALE_DOWN_STABLE_SECONDS": "15", "TESSERA_AUTOSCALE_KV_LOW": "0.9",
          "TESSERA_AUTOSCALE_KV_HIGH": "0.99", "TESSERA_AUTOSCALE_DRAIN_SECONDS": "30"}
WINDOW = 10.0  # seconds per timeline row


def fresh_database() -> str:
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")
    return f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"


def setup_django(url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings.base"
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("TESSERA_API_KEY_SECRET", "bench-" + uuid.uuid4().hex)
    os.environ.update(CLOCKS)  # the Stack copies os.environ into every process it starts
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


class Recorder:
    """Every premium request's (start, TTFT) and each sample of the fleet, by time since the start."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.premium: list[tuple[float, float | None]] = []  # (start, ttft or None when it failed)
        self.samples: list[dict] = []
        self.load_clients = 0
        self.load_served = 0
        self.lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0


def premium_client(base: str, key: str, model: str, rec: Recorder, stop: threading.Event) -> None:
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
    while not stop.is_set():
        start = rec.now()
        ttft = None
        try:
            stream = client.chat.completions.create(model=model, stream=True, max_tokens=16, temperature=0,
                                                    messages=[{"role": "user", "content": "Name three colours."}])
            for chunk in stream:
                if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                    ttft = rec.now() - start
        except openai.APIError:
            time.sleep(0.2)
        rec.premium.append((start, ttft))


def load_client(base: str, key: str, model: str, rec: Recorder, stop: threading.Event) -> None:
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
    with rec.lock:
        rec.load_clients += 1
    try:
        while not stop.is_set():
            try:
                client.chat.completions.create(model=model, max_tokens=24, temperature=0,
                                               messages=[{"role": "user", "content": "Count to ten."}])
                with rec.lock:
                    rec.load_served += 1
            except openai.APIError:
                time.sleep(0.2)
    finally:
        with rec.lock:
            rec.load_clients -= 1


def sampler(model: str, rec: Recorder, stop: threading.Event, hourly: Decimal) -> None:
    from django.db import close_old_connections

    from controlplane.deployments.models import Deployment, Replica

    while not stop.is_set():
        close_old_connections()
        dep = Deployment.objects.filter(name=model).first()
        ready = Replica.objects.filter(deployment__name=model, status="ready", drain_started_at__isnull=True).count()
        rec.samples.append({"t": rec.now(), "desired": dep.desired_replicas if dep else 0, "ready": ready,
                            "load_clients": rec.load_clients, "load_served": rec.load_served,
                            "cost_per_minute": float(hourly * ready / 60)})
        stop.wait(1.0)


def timeline(rec: Recorder, step_at: float, step_end: float, slo_ms: float) -> list[dict]:
    rows = []
    end = rec.samples[-1]["t"] if rec.samples else 0.0
    t = 0.0
    while t < end:
        window = [s for s in rec.samples if t <= s["t"] < t + WINDOW]
        ttfts = [1000 * f for s, f in rec.premium if t <= s < t + WINDOW and f is not None]
        failed = sum(1 for s, f in rec.premium if t <= s < t + WINDOW and f is None)
        if window:
            phase = "baseline" if t + WINDOW <= step_at else ("step" if t < step_end else "after")
            rows.append({"t": t, "phase": phase, "load_clients": max(s["load_clients"] for s in window),
                         "desired": window[-1]["desired"], "ready": window[-1]["ready"],
                         "premium_requests": len(ttfts) + failed, "premium_failed": failed,
                         "premium_ttft_p95_ms": percentile(ttfts, 95),
                         "within_slo": (percentile(ttfts, 95) or 0) <= slo_ms if ttfts else None,
                         "cost_per_minute": sum(s["cost_per_minute"] for s in window) / len(window)})
        t += WINDOW
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-seconds", type=float, default=30.0)
    p.add_argument("--step-seconds", type=float, default=150.0)
    p.add_argument("--load-clients", type=int, default=6)
    p.add_argument("--shrink-timeout", type=float, default=480.0,
                   help="seconds after the load to wait for 1 replica (the premium SLO's burn window holds it first)")
    p.add_argument("--worker-threads", type=int, default=1,
                   help="torch threads per worker (three workers share this host's cores)")
    p.add_argument("--max-num-seqs", type=int, default=1,
                   help="the deployment's seats per replica (1: a few clients make a queue; 2: the premium stream "
                        "alone does not fill a replica, so the load's end can bring it back to 1)")
    p.add_argument("--hourly-cost", default="0.50", help="the CPU worker class's rate (USD per hour)")
    p.add_argument("--render", help="re-derive the table and charts from a saved autoscale.json")
    args = p.parse_args()
    if args.render:
        render(args.render)
        return
    setup_django(fresh_database())
    from django.utils import timezone

    from benchmarks.live_stack import MODEL, Stack, operator_client, wait_for
    from billing.services.worker_rates import worker_rate_create
    from controlplane.audit.models import AuditEvent
    from controlplane.deployments.models import Worker
    from tenants import selectors, services

    hourly = Decimal(args.hourly_cost)
    stack = Stack(BROKER)
    stop_all = threading.Event()
    rec = Recorder()
    try:
        for suffix in ("a", "b", "c"):
            stack.add_worker(suffix, TESSERA_WORKER_THREADS=str(args.worker_threads))
        stack.wait_ready()
        wait_for(lambda: Worker.objects.filter(name__in=list(stack.workers), status="ready").count() == 3, 120,
                 "the workers to register", stack)
        worker_rate_create(worker_class="cpu", hourly_cost=hourly, prefill_tokens_per_second=Decimal(2000),
                           decode_tokens_per_second=Decimal(60),
                           effective_from=timezone.now().replace(minute=0, second=0, microsecond=0))
        premium_tier = selectors.tier_get(name="premium")
        _, premium_key = services.tenant_create_with_key(name="Premium bench", tier=premium_tier)
        _, load_key = services.tenant_create_with_key(name="Load bench", tier=selectors.tier_get(name="standard"))
        api = operator_client(stack, username=f"op-{uuid.uuid4().hex[:6]}")
        assert api.post("/models/", json={"name": MODEL}).status_code == 201
        created = api.post("/deployments/", json={"model": MODEL, "replicas": 1, "min_replicas": 1,
                                                  "max_replicas": 3, "engine_args": {"kv_cache_memory": "128MiB",
                                                                                     "max_num_seqs": args.max_num_seqs}})
        assert created.status_code == 201, created.text
        from controlplane.deployments.models import Replica

        wait_for(lambda: Replica.objects.filter(deployment__name=MODEL, status="ready").count() == 1, 180,
                 "the first replica", stack)
        rec.t0, wall0 = time.monotonic(), timezone.now()
        threads = [threading.Thread(target=sampler, args=(MODEL, rec, stop_all, hourly), daemon=True),
                   threading.Thread(target=premium_client, args=(stack.url, premium_key.secret, MODEL, rec, stop_all),
                                    daemon=True)]
        for t in threads:
            t.start()
        time.sleep(args.baseline_seconds)
        step_at = rec.now()
        stop_load = threading.Event()
        loaders = [threading.Thread(target=load_client, args=(stack.url, load_key.secret, MODEL, rec, stop_load),
                                    daemon=True) for _ in range(args.load_clients)]
        for t in loaders:
            t.start()
        time.sleep(args.step_seconds)
        stop_load.set()
        for t in loaders:
            t.join(130)
        step_end = rec.now()
        deadline = time.monotonic() + args.shrink_timeout
        while time.monotonic() < deadline:
            if rec.samples and rec.samples[-1]["desired"] == 1 and rec.samples[-1]["ready"] == 1:
                break
            time.sleep(1)
        time.sleep(WINDOW)  # one quiet row at 1 replica
        stop_all.set()
        for t in threads:
            t.join(130)
        events = [{"at": (e.at - wall0).total_seconds(),
                   "from": e.changes["desired_replicas"][0], "to": e.changes["desired_replicas"][1],
                   "reason": (e.changes.get("reason") or ["", ""])[1]}
                  for e in AuditEvent.objects.filter(action="deployment.autoscale").order_by("at")]
        api.close()
    finally:
        stop_all.set()
        stack.stop()
    slo_ms = float(premium_tier.slo_ttft_p95_ms or 1000)
    rows = timeline(rec, step_at, step_end, slo_ms)
    data = summarize(rec, rows, step_at, step_end, slo_ms, events, args, hourly)
    charts(rows, slo_ms)
    jpath, mpath = write_results("autoscale", data, table(data))
    print(table(data))
    print(f"wrote {jpath} and {mpath}")


def summarize(rec: Recorder, rows: list[dict], step_at: float, step_end: float, slo_ms: float, events: list[dict],
              args, hourly: Decimal) -> dict:
    grown = next((s["t"] for s in rec.samples if s["t"] >= step_at and s["ready"] >= 2), None)
    back = next((s["t"] for s in rec.samples if s["t"] >= step_end and s["desired"] == 1 and s["ready"] == 1), None)
    peak = max((s["ready"] for s in rec.samples), default=0)

    def p95(lo: float, hi: float) -> float | None:
        return percentile([1000 * f for s, f in rec.premium if lo <= s < hi and f is not None], 95)

    return {"environment": environment(), "clocks": CLOCKS, "load_clients": args.load_clients,
            "worker_threads": args.worker_threads, "max_num_seqs": args.max_num_seqs,
            "baseline_seconds": args.baseline_seconds, "step_seconds": args.step_seconds,
            "hourly_cost_usd": str(hourly), "premium_slo_ttft_ms": slo_ms,
            "grown_to_2_after_s": None if grown is None else grown - step_at, "peak_ready": peak,
            "back_to_1_after_s": None if back is None else back - step_end,
            "premium_ttft_p95_ms": {"baseline": p95(0, step_at), "step_until_grown": p95(step_at, grown or step_end),
                                    "step_after_grown": p95(grown, step_end) if grown else None,
                                    "after": p95(step_end, rows[-1]["t"] + WINDOW if rows else step_end)},
            "premium_within_slo_after_s": recovery(rows, step_at, args.load_clients),
            "step_at": step_at, "step_end": step_end,
            "premium_failed": sum(1 for _, f in rec.premium if f is None), "premium_requests": len(rec.premium),
            "load_served": rec.load_served, "events": events,
            "ups": sum(1 for e in events if e["to"] > e["from"]), "downs": sum(1 for e in events if e["to"] < e["from"]),
            "cost_usd": round(sum(r["cost_per_minute"] * WINDOW / 60 for r in rows), 4), "rows": rows}


def recovery(rows: list[dict], step_at: float, load_clients: int) -> float | None:
    """Seconds from the step to the first window after which every window at full load is within the
    SLO (a window while the load winds down does not count: that is the load leaving, not the fleet
    growing); None: never."""
    full = [r for r in rows if r["phase"] == "step" and r["premium_ttft_p95_ms"] is not None
            and r["load_clients"] >= load_clients]
    for i, r in enumerate(full):
        if all(x["within_slo"] for x in full[i:]):
            return r["t"] - step_at
    return None


def render(path: str) -> None:
    """Re-derive the recovery and the table from a saved autoscale.json."""
    d = json.loads(Path(path).read_text())
    d["premium_within_slo_after_s"] = recovery(d["rows"], d.get("step_at", d["baseline_seconds"]), d["load_clients"])
    charts(d["rows"], d["premium_slo_ttft_ms"])
    write_results("autoscale", d, table(d))
    print(table(d))


def charts(rows: list[dict], slo_ms: float) -> None:
    from common.admin_charts import Series, line_chart

    labels = [f"{r['t']:.0f}" for r in rows]
    top = max([r["desired"] for r in rows] + [r["load_clients"] for r in rows] + [1])
    fleet = line_chart(title="Replicas (desired, ready) and load clients over seconds", labels=labels, y_min=0.0,
                       y_max=top + 1, value_format=lambda v: f"{v:.0f}",
                       series=[Series("desired", [r["desired"] for r in rows], "#417690"),
                               Series("ready", [r["ready"] for r in rows], "#2e7d32"),
                               Series("load clients", [r["load_clients"] for r in rows], "#c62828")])
    ttft = [r["premium_ttft_p95_ms"] for r in rows]
    latency = line_chart(title="Premium TTFT p95 (ms) per 10 s over seconds", labels=labels, y_min=0.0,
                         y_max=max([v for v in ttft if v is not None] + [slo_ms]) * 1.1, reference=slo_ms,
                         reference_label="premium SLO", value_format=lambda v: f"{v:.0f}",
                         series=[Series("premium TTFT p95", ttft, "#6a1b9a")])
    Path(RESULTS).mkdir(parents=True, exist_ok=True)
    (RESULTS / "autoscale_replicas.svg").write_text(str(fleet))
    (RESULTS / "autoscale_ttft.svg").write_text(str(latency))


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def _s(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f} s"


def table(d: dict) -> str:
    env = d["environment"]
    p = d["premium_ttft_p95_ms"]
    lines = ["# Autoscaling on the real stack\n",
             f"{env['cpu']} ({env['cpu_capability']}), {env['when']}; `python -m benchmarks.autoscale` "
             f"(--load-clients {d['load_clients']}, step {d['step_seconds']:.0f} s). Control plane + 3 managed "
             "SmolLM2 CPU workers "
             f"({d.get('worker_threads', 'default')} torch thread each) on PostgreSQL and Redis; deployment min 1 / max 3, "
             f"max_num_seqs {d.get('max_num_seqs', 1)}; shortened "
             "clocks (up cooldown 8 s, down 15 s); CPU worker class at "
             f"{d['hourly_cost_usd']} USD/h.\n",
             f"- grew to 2 ready replicas **{_s(d['grown_to_2_after_s'])}** after the load step (peak "
             f"{d['peak_ready']} ready); back to 1 **{_s(d['back_to_1_after_s'])}** after the load stopped; "
             f"{d['ups']} scale-ups, {d['downs']} scale-downs",
             f"- premium TTFT p95: baseline {_ms(p['baseline'])} ms, step before growth {_ms(p['step_until_grown'])} ms, "
             f"step after growth {_ms(p['step_after_grown'])} ms, after the step {_ms(p['after'])} ms (SLO "
             f"{d['premium_slo_ttft_ms']:.0f} ms); every later 10 s window at full load within the SLO from "
             f"**{_s(d['premium_within_slo_after_s']) if d['premium_within_slo_after_s'] is not None else 'never'}**"
             f"{' after the step' if d['premium_within_slo_after_s'] is not None else ''}; {d['premium_failed']} of "
             f"{d['premium_requests']} premium requests failed",
             f"- the run cost {d['cost_usd']:.4f} USD; {d['load_served']} load requests served\n",
             *([d["note"] + "\n"] if d.get("note") else []),
             "![replicas](autoscale_replicas.svg) ![premium TTFT](autoscale_ttft.svg)\n",
             "| t (s) | phase | load clients | desired | ready | premium req. | premium TTFT p95 (ms) | cost / min (USD) |",
             "|---:|:--|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        lines.append(f"| {r['t']:.0f} | {r['phase']} | {r['load_clients']} | {r['desired']} | {r['ready']} | "
                     f"{r['premium_requests']} | {_ms(r['premium_ttft_p95_ms'])} | {r['cost_per_minute']:.4f} |")
    lines.append("\nAutoscaler decisions (seconds since the start): " + "; ".join(
        f"{e['at']:.0f} s {e['from']}→{e['to']} ({e['reason']})" for e in d["events"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
