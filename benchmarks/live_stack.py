"""A real control plane (uvicorn + a Celery worker with beat, as processes) on the database Django is
configured with (the test database in tests) and real managed data-plane workers
(`python -m dataplane.worker.agent`), all over a real broker. Used by the live tests
(tests/controlplane/deployments/) and by `benchmarks.autoscale`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from benchmarks.gateway import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "live-worker-token"
MODEL = "smollm2-135m-instruct"


def database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db.get('USER') or 'postgres'}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


class Process:
    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def logs(self, tail: int = 4000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-tail:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not os.environ.get("TESSERA_TEST_KEEP_LOGS"):
            Path(self.log.name).unlink(missing_ok=True)


class Stack:
    """The control plane's processes; `add_worker` starts managed data-plane workers."""

    def __init__(self, broker_url: str) -> None:
        self.broker_url = broker_url
        self.var = Path(tempfile.mkdtemp(prefix="tessera-live-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.run_id = uuid.uuid4().hex[:6]
        self.env = {
            **os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base", "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": broker_url, "TESSERA_WORKER_TOKEN": TOKEN, "TESSERA_VAR_DIR": str(self.var),
            "TESSERA_INTERNAL_TOKEN": "internal-" + TOKEN, "TESSERA_ADAPTER_ROOT": str(self.var / "adapters"),
            "TESSERA_WORKER_ADAPTER_ROOT": str(self.var / "adapters"),
            "TESSERA_WORKERS": "", "TESSERA_RECONCILE_SECONDS": "1", "TESSERA_WORKER_HEARTBEAT_SECONDS": "0.5",
            "TESSERA_WORKER_DEAD_SECONDS": "4", "TESSERA_WORKER_POLL_SECONDS": "0.5",
            "TESSERA_AUTH_CACHE_SECONDS": "0", "TESSERA_LIMITER": "database", "PYTHONUNBUFFERED": "1",
            # The control plane's own queue, named per run so that runs sharing a broker never mix.
            "TESSERA_CONTROL_QUEUE": f"control-{self.run_id}",
        }
        from django.conf import settings

        # Keys made by the test process must verify in the control plane's processes.
        self.env["TESSERA_API_KEY_SECRET"] = settings.TESSERA_API_KEY_SECRET
        self.env.pop("REDIS_URL", None)
        py = sys.executable
        self.processes = [
            Process("web", [py, "-m", "uvicorn", "controlplane.asgi:application", "--port", str(self.port),
                            "--log-level", "warning"], self.env),
            Process("celery", [py, "-m", "celery", "-A", "controlplane", "worker", "-B", "-s",
                               str(self.var / "beat-schedule"), "--pool", "threads", "-c", "2",
                               "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "warning"],
                    self.env),
        ]
        self.workers: dict[str, Process] = {}

    def wait_ready(self) -> None:
        """The control plane answers (workers started alongside register on their own)."""
        self._wait_http(self.url + "/internal/v1/health", self.processes[0])

    def add_worker(self, suffix: str, **extra_env: str) -> str:
        name = f"live-{self.run_id}-{suffix}"
        port = free_port()
        env = {**self.env, "TESSERA_CONTROL_PLANE_URL": self.url, "TESSERA_WORKER_ID": name,
               "TESSERA_BROKER_URL": self.broker_url, "TESSERA_HEARTBEAT_SECONDS": "0.5",
               "TESSERA_UNLOAD_GRACE_SECONDS": "2", **extra_env}
        env.pop("DATABASE_URL")  # a data-plane worker has no database credentials
        self.workers[name] = Process(name, [sys.executable, "-m", "dataplane.worker.agent", "--port", str(port),
                                            "--dtype", "bfloat16", "--kv-cache-memory", "128MiB"], env)
        return name

    def _wait_http(self, url: str, process: Process, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited:\n{process.logs()}")
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{url} did not answer:\n{process.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.logs(3000)}" for p in [*self.processes, *self.workers.values()])

    def stop(self) -> None:
        """SIGTERM everything at once (workers drain, Celery warm-shuts down), then wait for each."""
        everything = [*self.workers.values(), *self.processes]
        for process in everything:
            if process.alive():
                process.proc.send_signal(signal.SIGTERM)
        for process in everything:
            process.stop()


def wait_for(predicate, timeout: float, what: str, stack: Stack | None = None, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" +
                                 (f"\n{stack.logs()}" if stack is not None else ""))
        time.sleep(interval)


def operator_client(stack: Stack, username: str = "op", password: str = "pw") -> httpx.Client:
    """A staff user logged in to the control plane (session + CSRF), for /api/v1 calls."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()  # what the control plane's (non-test) settings can verify
    get_user_model().objects.create(username=username, is_staff=True, is_superuser=True,
                                    password=hasher.encode(password, hasher.salt()))
    client = httpx.Client(base_url=stack.url, timeout=30)
    client.get("/admin/login/")
    login = client.post("/admin/login/", data={"username": username, "password": password, "next": "/admin/",
                                                "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    if "sessionid" not in client.cookies:
        raise AssertionError(f"operator login failed: {login.status_code}")
    client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
    client.base_url = stack.url + "/api/v1"
    return client
