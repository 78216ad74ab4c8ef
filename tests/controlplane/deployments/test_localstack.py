"""`python -m controlplane.localstack` (what `make run` runs): it serves, prints the two lines, and
Ctrl-C stops every process it started."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import openai
import pytest

from tests.dataplane.worker.process import free_port

from .live import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.model]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_local_stack_serves_prints_the_two_lines_and_stops_cleanly(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "TESSERA_WORKER_TOKEN")}
    env.update(DJANGO_SETTINGS_MODULE="controlplane.settings.base", TESSERA_VAR_DIR=str(tmp_path),
               PYTHONUNBUFFERED="1")
    port, worker_port = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.localstack", "--port", str(port),
                             "--worker-port", str(worker_port), "--kv-cache-memory", "128MiB"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("TESSERA_API_KEY=") for line in lines):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        values = dict(line.strip().split("=", 1) for line in lines if re.match(r"^TESSERA_(URL|API_KEY)=", line))
        assert values["TESSERA_URL"] == f"http://127.0.0.1:{port}/v1"
        assert values["TESSERA_API_KEY"].startswith("sk-")
        output = "".join(lines)
        assert "curl " in output and "from openai import OpenAI" in output and values["TESSERA_API_KEY"] in output
        pids = [int(pid) for pid in re.findall(r"started \S+\s+pid (\d+)", output)]
        assert len(pids) == 4  # web, celery worker, celery beat, data-plane worker

        client = openai.OpenAI(base_url=values["TESSERA_URL"], api_key=values["TESSERA_API_KEY"], max_retries=0,
                               timeout=60)
        reply = client.chat.completions.create(model="smollm2-135m-instruct", max_tokens=6, temperature=0,
                                               messages=[{"role": "user", "content": "Say hello."}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens >= 1
        with sqlite3.connect(tmp_path / "tessera.sqlite3", timeout=30) as db:  # served as the GGUF's own blocks
            assert db.execute("SELECT quantization FROM deployments_deployment WHERE name = ?",
                              ("smollm2-135m-instruct",)).fetchall() == [("gguf",)]

        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, "".join(lines)
        assert all(gone(pid) for pid in pids), "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
