"""`make run`, stopped and started again on the same var/: the two lines it prints mean "use me now".

The local stack runs as `make run` does (python -m controlplane.localstack, embedded SQLite and
file-system broker, the real SmolLM2) on a temporary var/ and ports of its own. The first run ends
with a kill of every process (no clean release: its worker stays recorded as ready with a fresh
heartbeat, the case that made restarts route to a worker that was not there); the second starts
on that state, and requests sent the moment its lines appear must all succeed. Then a clean
Ctrl-C, which releases the worker's registration. Also checked on the running stack: the admin's
static files are served, and the first requests are priced (no "no price in force" in the log).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    def __init__(self, var: Path, port: int, worker_port: int) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "TESSERA_BROKER_FOLDER")}
        env.update(TESSERA_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="controlplane.settings.base")
        for name in ("TESSERA_WORKER_TOKEN", "TESSERA_INTERNAL_TOKEN"):
            env.pop(name, None)  # each run makes its own, as `make run` does
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controlplane.localstack", "--port", str(port), "--worker-port", str(worker_port)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.child_pids: list[int] = []
        self.url = self.key = ""

    def wait_ready(self, timeout: float = 180) -> float:
        started = time.monotonic()
        for line in self.proc.stdout:
            self.lines.append(line)
            if found := re.match(r"\s+started \S+\s+pid (\d+)", line):
                self.child_pids.append(int(found.group(1)))
            if line.startswith("TESSERA_URL="):
                self.url = line.split("=", 1)[1].strip()
            if line.startswith("TESSERA_API_KEY="):
                self.key = line.split("=", 1)[1].strip()
                return time.monotonic() - started
            assert time.monotonic() - started < timeout, "".join(self.lines)
        raise AssertionError(f"the stack exited ({self.proc.wait()}):\n{''.join(self.lines)}")

    def kill(self) -> None:
        """Every process of this stack at once, with no chance to release anything."""
        for pid in [self.proc.pid, *self.child_pids]:
            try:
                os.killpg(pid, signal.SIGKILL)  # each child leads its own process group
            except ProcessLookupError:
                pass
        self.proc.wait(30)

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.lines.extend(self.proc.stdout.read().splitlines(keepends=True))
        return code


@pytest.fixture
def stacks(tmp_path):
    started: list[Stack] = []
    ports = (_free_port(), _free_port())

    def start() -> Stack:
        stack = Stack(tmp_path, *ports)
        started.append(stack)
        return stack

    yield start
    for stack in started:
        if stack.proc.poll() is None:
            stack.kill()


def _burst(url: str, key: str) -> list[tuple[str, int, str]]:
    """What a user does the moment the lines appear: list the models and chat, several at once."""
    headers = {"Authorization": f"Bearer {key}"}

    def models():
        reply = httpx.get(f"{url}/models", headers=headers, timeout=30)
        ok = reply.status_code == 200 and MODEL in {m["id"] for m in reply.json()["data"]}
        return "models", reply.status_code if ok else -reply.status_code, reply.text[:300]

    def chat(i: int):
        reply = httpx.post(f"{url}/chat/completions", headers=headers, timeout=120, json={
            "model": MODEL, "messages": [{"role": "user", "content": f"Say hello to {i}."}], "max_tokens": 4})
        return "chat", reply.status_code, reply.text[:300]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(models), *(pool.submit(chat, i) for i in range(6)), pool.submit(models)]
        return [f.result() for f in futures]


def test_restart_after_a_kill_serves_from_the_first_printed_line(stacks, tmp_path):
    first = stacks()
    first.wait_ready()
    assert all(status == 200 for _, status, _ in _burst(first.url, first.key))
    base = first.url.removesuffix("/v1")
    css = httpx.get(f"{base}/static/admin/css/base.css", timeout=10)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css") and "body" in css.text
    first.kill()

    with sqlite3.connect(tmp_path / "tessera.sqlite3") as db:  # the state the next start finds
        assert db.execute("select status from deployments_worker where name='local-cpu-0'").fetchone() == ("ready",)
        assert db.execute("select status from deployments_replica").fetchall() == [("ready",)]

    second = stacks()
    took = second.wait_ready()
    replies = _burst(second.url, second.key)
    assert [r for r in replies if r[1] != 200] == [], replies
    assert "the previous run's worker local-cpu-0 is gone" in "".join(second.lines)
    assert second.interrupt() == 0, "".join(second.lines)

    with sqlite3.connect(tmp_path / "tessera.sqlite3") as db:
        # The clean stop released the worker: a next start finds nothing to route to.
        assert db.execute("select status, boot_id from deployments_worker").fetchall() == [("dead", "")]
        priced = db.execute("select count(*), sum(price_id is null) from billing_usagerecord").fetchone()
    # At least the second run's readiness check and 6 chats (the killed run may have lost its last
    # batch of usage), every one priced.
    assert priced[0] >= 7 and priced[1] == 0, priced
    web_log = (tmp_path / "logs" / "web.log").read_text()
    assert "no price in force" not in web_log
    print(f"second start ready in {took:.1f} s")
