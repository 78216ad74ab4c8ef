"""A real worker process serving SmolLM2 on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

MODEL = "smollm2-135m-instruct"
TOKEN = "test-worker-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerProcess:
    def __init__(self, *flags: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", delete=False)  # noqa: SIM115
        env = {**os.environ, "TESSERA_WORKER_TOKEN": TOKEN}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dataplane.worker", "--model", MODEL, "--port", str(port), "--dtype", "bfloat16",
             "--kv-cache-memory", "256MiB", *flags],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.headers = {"Authorization": f"Bearer {TOKEN}"}

    def logs(self) -> str:
        with open(self.log.name) as f:
            return f.read()[-4000:]

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready after {timeout}s:\n{self.logs()}")

    def metrics(self) -> dict[str, float]:
        """Samples by name (label sets summed), e.g. {"tessera:num_requests_running": 0.0}."""
        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", headers=self.headers, timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                name = key.split("{", 1)[0]
                out[name] = out.get(name, 0.0) + float(value)
                out[key] = float(value)
        return out

    def wait_metric(self, name: str, predicate, timeout: float = 10.0) -> float:
        deadline = time.monotonic() + timeout
        while True:
            value = self.metrics().get(name, 0.0)
            if predicate(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} = {value} after {timeout}s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # nothing is in flight by now: the drain is immediate
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not os.environ.get("TESSERA_TEST_KEEP_LOGS"):
            os.unlink(self.log.name)


@contextlib.contextmanager
def running(*flags: str):
    """A WorkerProcess started and ready for the block, stopped after it (even when it failed to start)."""
    worker = WorkerProcess(*flags)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()
