"""`make run`: the whole platform on this machine, deployed through the real deployment path.

    python -m controlplane.localstack [--port 8000] [--worker-port 8100] [--model smollm2-135m-instruct]

Embedded defaults: SQLite and the file-system Celery broker under var/ (TESSERA_VAR_DIR), no
Redis. With DATABASE_URL, CELERY_BROKER_URL (Redis or RabbitMQ) and REDIS_URL set, it uses them.

1. migrate (seeds the tiers and the default list price), collect the static files (the admin's CSS/JS,
   the API docs), and mark the previous run's worker gone: its process is not running any more (its
   port is free), so its replica must not be routed to while the new worker boots and loads;
2. starts, each in its own process group with its log under var/logs/: the control plane (uvicorn,
   ASGI: gateway + admin + APIs), a Celery worker and Celery beat (the reconciler), and one CPU
   data-plane worker that registers itself and consumes its own queue, idle until told to load;
3. applies a Deployment of the model (1 replica): the reconciler places it, `load_model` runs in
   the data-plane worker, the replica turns ready;
4. makes a demo tenant and a fresh API key, waits until a chat completion through the gateway with
   that key succeeds (so whatever uses the printed lines works at once), prints the key, a curl and
   an openai example, and finally the two lines `TESSERA_URL=...` and `TESSERA_API_KEY=...` on their own;
5. runs until SIGINT (Ctrl-C) or SIGTERM: then terminates every child, waits for them, exits 0.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import django
import httpx
from django.core.management import call_command
from django.db import close_old_connections
from django.db.models import Q

ROOT = Path(__file__).resolve().parent.parent
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
WORKER_ID = "local-cpu-0"


class Child:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.log_path = logs / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open for the child's lifetime
        # A process group of its own: a terminal's Ctrl-C reaches only this script, which stops
        # the children in order (a second SIGINT would cut the data-plane worker's drain short).
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def terminate(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"  {self.name} did not stop in {timeout:.0f} s; killing it", flush=True)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m controlplane.localstack", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("TESSERA_PORT", "8000")))
    parser.add_argument("--worker-port", type=int, default=int(os.environ.get("TESSERA_WORKER_PORT", "8100")))
    parser.add_argument("--model", default=os.environ.get("TESSERA_MODEL", "smollm2-135m-instruct"))
    parser.add_argument("--kv-cache-memory", default="256MiB")
    parser.add_argument("--ready-timeout", type=float, default=600, help="seconds to wait for the model to serve")
    return parser.parse_args(argv)


def environment(args: argparse.Namespace) -> dict[str, str]:
    var = Path(os.environ.get("TESSERA_VAR_DIR") or ROOT / "var").resolve()
    var.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TESSERA_VAR_DIR": str(var), "PYTHONUNBUFFERED": "1", "TESSERA_WORKERS": ""}
    env.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.base")
    env.setdefault("TESSERA_WORKER_TOKEN", secrets.token_urlsafe(24))  # this run's workers and control plane
    env.setdefault("TESSERA_INTERNAL_TOKEN", secrets.token_urlsafe(24))  # the workers' internal API: its own
    adapters = Path(env.setdefault("TESSERA_ADAPTER_ROOT", str(var / "adapters")))  # tenant T's under <root>/T/
    adapters.mkdir(parents=True, exist_ok=True)
    env.setdefault("TESSERA_WORKER_ADAPTER_ROOT", str(adapters))  # the worker checks the same store again
    env.setdefault("TESSERA_RECONCILE_SECONDS", "2")
    env.setdefault("CELERY_BROKER_URL", "filesystem://")
    if env["CELERY_BROKER_URL"].startswith("filesystem://"):
        broker = Path(env.setdefault("TESSERA_BROKER_FOLDER", str(var / "broker")))
        shutil.rmtree(broker / "queue", ignore_errors=True)  # messages of an earlier run: nobody consumes yet
    return env


def worker_threads(cores: int) -> int:
    """The engine's threads when the whole stack shares this host: one core left to the rest.

    With as many OpenMP threads as cores, any other runnable thread (the gateway answering a flood of
    429s, the worker's own event loop, a client) lands on a core an OpenMP thread needs, and every
    parallel region waits for it: under a free-tier flood on 2 cores the engine's decode step went
    from 25 ms to over 1 s (benchmarks.flood). With one core left over it stayed at 35 ms, and one
    thread costs the idle batch-1 step only ~20 % here."""
    return max(1, cores - 1)


def start_children(args: argparse.Namespace, env: dict[str, str], logs: Path) -> list[Child]:
    py, var = sys.executable, Path(env["TESSERA_VAR_DIR"])
    control_plane = f"http://{args.host}:{args.port}"
    worker_env = {**env, "TESSERA_CONTROL_PLANE_URL": control_plane, "TESSERA_WORKER_ID": WORKER_ID}
    worker_env.pop("DATABASE_URL", None)  # a data-plane worker talks to the control plane over HTTP only
    worker_env.setdefault("TESSERA_WORKER_THREADS", str(worker_threads(os.cpu_count() or 1)))
    quiet = ["--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "warning"]
    specs = [
        ("web", [py, "-m", "uvicorn", "controlplane.asgi:application", "--host", args.host, "--port",
                 str(args.port), "--log-level", "warning"], env),
        ("celery-worker", [py, "-m", "celery", "-A", "controlplane", "worker", "--pool", "threads", "-c", "2",
                           *quiet], env),
        ("celery-beat", [py, "-m", "celery", "-A", "controlplane", "beat", "-s", str(var / "celerybeat-schedule"),
                         "-l", "warning"], env),
        # The ITL guard as benchmarks/load.py measures it on a CPU (docs/slo.md): premium and enterprise
        # (priority <= 10) keep their ITL while lower tiers wait for one seat and small prefill chunks;
        # batch lines (TESSERA_BATCH_PRIORITY, 1000) run only in steps no online request wants.
        ("worker", [py, "-m", "dataplane.worker.agent", "--host", args.host, "--port", str(args.worker_port),
                    "--dtype", "auto", "--kv-cache-memory", args.kv_cache_memory, "--itl-guard-priority", "10",
                    "--itl-guard-seqs", "1", "--itl-guard-step-tokens", "16", "--itl-guard-step-ms", "60",
                    "--background-priority", "1000"],
         worker_env),
    ]
    children = []
    for name, argv, child_env in specs:
        child = Child(name, argv, child_env, logs)
        children.append(child)
        print(f"  started {name:<14} pid {child.pid:<7} log {child.log_path}", flush=True)
    return children


def release_previous_workers(worker_id: str, worker_url: str) -> list[str]:
    """Mark gone the registrations this stack's worker replaces (its name, or its URL whose port we hold).

    A stop that could not release them (Ctrl-C twice, a kill, the web process gone first) leaves them
    ready with a heartbeat up to TESSERA_WORKER_DEAD_SECONDS old, and the gateway would route the
    model there until the new worker registers and loads it again.
    """
    # lazy: models, importable only after setup_platform's django.setup() (this launcher starts without Django)
    from controlplane.deployments import services as deployments
    from controlplane.deployments.models import Worker, WorkerStatus

    released = []
    url = worker_url.rstrip("/")
    for worker in Worker.objects.filter(Q(name=worker_id) | Q(url=url) | Q(url=f"{url}/")).exclude(
            status=WorkerStatus.DEAD, boot_id=""):
        deployments.worker_release(worker=worker, reason="the local stack restarted: its previous worker is gone")
        released.append(worker.name)
    return released


def local_quantization(model_name: str) -> str:
    """How make run deploys the model: a deployment it made before keeps its own; a GGUF model (SmolLM2,
    the default) is served as the file's own Q4_1/Q8_0 blocks, the rest at bf16.

    Why gguf: a GGUF's blocks are what the file holds, and the CPU worker's fused GGUF decode step
    decodes SmolLM2 about 3x faster than the bf16 weights dequantized from it (1 thread on the
    Intel Xeon of 2026-11-28: 10.9 against 33.2 ms a token at batch 1, 13.5 against 33.9 at batch 2;
    prefill the same, from the dense copy kept above 8 rows). Its quality gate passes (+0.24 %
    perplexity, docs/deployments.md). A shorter step is also a shorter wait for a paying tenant's
    request that arrives while another tenant's step runs (benchmarks.flood)."""
    # lazy: models after django.setup(), as above; the data plane's registry (torch) only to name a file
    from controlplane.deployments.models import Deployment
    from dataplane.models.registry import resolve_model_path

    existing = Deployment.objects.filter(name=model_name).first()
    if existing is not None:
        return existing.quantization
    try:
        gguf = resolve_model_path(model_name).suffix == ".gguf"
    except ValueError:  # not a model this machine can resolve: the worker will say why
        gguf = False
    return "gguf" if gguf else "bf16"


def setup_platform(model_name: str, worker_id: str, worker_url: str) -> tuple[str, str]:
    """Migrate, collect static files, forget the previous run's worker, deploy the model through the
    deployments services, make the demo key -> (key, tenant slug)."""
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    call_command("collectstatic", verbosity=0, interactive=False)
    released = release_previous_workers(worker_id, worker_url)
    if released:
        print(f"  the previous run's worker {', '.join(released)} is gone: nothing is routed to it", flush=True)
    # lazy: models, importable only after the django.setup() above
    from controlplane.deployments import services as deployments
    from controlplane.deployments.models import Model
    from tenants import selectors, services
    from tenants.models import Tenant

    quantization = local_quantization(model_name)
    model = Model.objects.filter(name=model_name).first() or deployments.model_create(
        name=model_name, quantizations=sorted({"bf16", quantization}))
    if quantization not in model.quantizations:
        model = deployments.model_update(model=model, quantizations=[*model.quantizations, quantization])
    deployments.deployment_apply(model=model, replicas=1, quantization=quantization, name=model_name)
    tenant = Tenant.objects.filter(slug="demo").first()
    if tenant is None:
        tenant, created = services.tenant_create_with_key(name="Demo", slug="demo",
                                                          tier=selectors.tier_get(name="enterprise"))
    else:
        created = services.api_key_create(tenant=tenant, name=f"localstack {time.strftime('%Y-%m-%d %H:%M')}",
                                          can_manage=True)
    return created.secret, tenant.slug


def replica_summary(model_name: str) -> str:
    from controlplane.deployments.models import Replica  # lazy: models, after django.setup()

    close_old_connections()
    rows = Replica.objects.filter(deployment__name=model_name).values_list("status", "reason")
    return ", ".join(f"{status}" + (f" ({reason})" if reason else "") for status, reason in rows) or "none yet"


def serves_chat(base: str, key: str, model: str) -> bool:
    """The model is listed for the key and a chat completion through the gateway answers with it."""
    headers = {"Authorization": f"Bearer {key}"}
    try:
        listed = httpx.get(f"{base}/v1/models", headers=headers, timeout=5)
        if listed.status_code != 200 or model not in {m["id"] for m in listed.json().get("data", [])}:
            return False
        answer = httpx.post(f"{base}/v1/chat/completions", headers=headers, timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 1})
        return answer.status_code == 200 and bool(answer.json().get("choices"))
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def wait_until_served(base: str, key: str, model: str, children: list[Child], timeout: float,
                      stopping: threading.Event) -> None:
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline and not stopping.is_set():
        for child in children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited with {child.proc.returncode}:\n{child.tail()}")
        if serves_chat(base, key, model):
            return
        state = replica_summary(model)
        if state != last:
            print(f"  replica: {state}", flush=True)
            last = state
        stopping.wait(1.0)
    if not stopping.is_set():
        raise TimeoutError(f"{model} did not serve within {timeout:.0f} s (see the logs)")


def banner(base: str, key: str, model: str, logs: Path) -> str:
    return f"""
Tessera is up: {model} is deployed on one CPU worker and served through the gateway.

  API key (tenant "demo", shown once): {key}
  Admin:  {base}/admin/   (create a login: python manage.py createsuperuser)
  API:    {base}/api/v1/docs/
  Logs:   {logs}/

curl {base}/v1/chat/completions \\
  -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
  -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

python - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{base}/v1", api_key="{key}")
reply = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hello!"}}])
print(reply.choices[0].message.content)
EOF

Ctrl-C stops everything.
"""


def stop_children(children: list[Child]) -> None:
    print("stopping...", flush=True)
    # The data-plane worker first, alone: it drains and releases its registration through the control
    # plane, which must still answer; then the rest together.
    worker, rest = children[-1:], children[:-1]
    for group in (worker, rest):
        for child in reversed(group):
            child.terminate()
        for child in reversed(group):
            child.wait(30)
            print(f"  {child.name} exited ({child.proc.returncode})", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for port in (args.port, args.worker_port):
        if not port_free(args.host, port):
            print(f"error: {args.host}:{port} is in use (--port / --worker-port choose others)", file=sys.stderr)
            return 2
    env = environment(args)
    os.environ.update({k: v for k, v in env.items() if k not in os.environ or os.environ[k] != v})
    logs = Path(env["TESSERA_VAR_DIR"]) / "logs"
    logs.mkdir(exist_ok=True)
    stopping = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stopping.set())

    print(f"Tessera local stack (state in {env['TESSERA_VAR_DIR']})", flush=True)
    key, _ = setup_platform(args.model, WORKER_ID, f"http://{args.host}:{args.worker_port}")
    children = start_children(args, env, logs)
    base = f"http://{args.host}:{args.port}"
    code = 0
    try:
        wait_until_served(base, key, args.model, children, args.ready_timeout, stopping)
        if not stopping.is_set():
            print(banner(base, key, args.model, logs), flush=True)
            print(f"TESSERA_URL={base}/v1", flush=True)
            print(f"TESSERA_API_KEY={key}", flush=True)
        while not stopping.wait(1.0):
            dead = next((c for c in children if not c.alive()), None)
            if dead is not None:
                print(f"{dead.name} exited with {dead.proc.returncode}:\n{dead.tail()}", file=sys.stderr, flush=True)
                code = 1
                break
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        stop_children(children)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
