"""The control plane's PostgreSQL goes away for longer than the "worker gone" threshold: workers'
heartbeats fail meanwhile (the internal API cannot record them), and the reconciler cannot run. When
the database is back, no worker is marked gone and no replica moves or reloads (no flap), and the
reconciler and the worker logged the outage in a few lines, not a traceback per tick or a line per beat.

Real parts: a throwaway PostgreSQL (tests/throwaway_services.py) stopped and started under the
control plane (uvicorn, a Celery worker with embedded beat, on a throwaway redis-server broker) and a
managed worker process (outage_agent.py: the real agent, heartbeating every 0.5 s; gone after 4 s).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psycopg
import pytest

from benchmarks import live_stack
from tests.throwaway_services import (  # noqa: F401 (fixtures)
    ThrowawayPostgres,
    throwaway_postgres,
    throwaway_redis,
)

from .live import ROOT, Process, Stack, wait_for

pytestmark = [pytest.mark.slow]

DEAD_SECONDS = 4  # live.Stack's TESSERA_WORKER_DEAD_SECONDS
OUTAGE_SECONDS = 3 * DEAD_SECONDS


@pytest.fixture
def stack(throwaway_postgres, throwaway_redis, monkeypatch):  # noqa: F811
    throwaway_postgres.migrate()
    monkeypatch.setattr(live_stack, "database_url", lambda: throwaway_postgres.url)  # where Stack reads it
    stack = Stack(throwaway_redis.url)
    stack.db = throwaway_postgres
    try:
        name = f"stub-{stack.run_id}"
        env = {**stack.env, "TESSERA_CONTROL_PLANE_URL": stack.url, "TESSERA_WORKER_ID": name,
               "TESSERA_BROKER_URL": throwaway_redis.url, "TESSERA_HEARTBEAT_SECONDS": "0.5"}
        env.pop("DATABASE_URL")
        stack.workers[name] = Process(name, [sys.executable, "-m", "tests.controlplane.deployments.outage_agent"], env)
        stack.wait_ready()
        yield stack
    finally:
        stack.db.resume()
        stack.stop()


def query(db: ThrowawayPostgres, sql: str, *params):
    try:
        with psycopg.connect(db.url, connect_timeout=2) as conn:
            return conn.execute(sql, params).fetchall()
    except psycopg.OperationalError:
        return None


def manage_shell(stack: Stack, code: str) -> None:
    env = {**stack.env, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base"}
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _lines(process: Process) -> list[str]:
    return [line for line in process.logs(tail=10**8).splitlines() if line.strip()]


def test_workers_whose_heartbeats_failed_while_the_database_was_down_are_not_marked_gone(stack):
    db: ThrowawayPostgres = stack.db
    worker = next(iter(stack.workers))
    wait_for(lambda: query(db, "SELECT 1 FROM deployments_worker WHERE name = %s AND status = 'ready'", worker),
             60, "the worker to register", stack)
    manage_shell(stack, "from controlplane.deployments import services as s; "
                        "s.deployment_create(model=s.model_create(name='m1'), replicas=1)")
    ready = "SELECT id, attempt FROM deployments_replica WHERE status = 'ready'"
    (replica_id, attempt), = wait_for(lambda: query(db, ready), 30, "the replica to be ready", stack)
    celery, agent = stack.processes[1], stack.workers[worker]
    celery_before, agent_before = len(_lines(celery)), len(_lines(agent))

    db.stop()
    time.sleep(OUTAGE_SECONDS)
    # The worker's next heartbeat lands after the reconciler's first pass (the race is the reconciler's one
    # time in four at the stack's 1 s passes and 0.5 s beats, one in five at the 5 s / 2 s defaults, per
    # worker per outage): the worker is frozen over the restart and for two reconcile intervals after it.
    agent_process = stack.workers[worker].proc
    agent_process.send_signal(signal.SIGSTOP)
    try:
        db.start()
        back = time.monotonic()
        time.sleep(2.5)
    finally:
        agent_process.send_signal(signal.SIGCONT)
    # Watch the worker and its replica for two full "gone" windows after the database is back.
    seen: set[tuple] = set()
    while time.monotonic() - back < 2 * DEAD_SECONDS + 2:
        rows = query(db, "SELECT w.status, r.status, r.attempt, r.worker_id IS NOT NULL FROM deployments_worker w "
                         "LEFT JOIN deployments_replica r ON r.worker_id = w.id WHERE w.name = %s", worker)
        if rows:
            seen.update(rows)
        time.sleep(0.2)
    print(f"\nstates seen after the database came back: {sorted(seen)}")
    assert seen == {("ready", "ready", attempt, True)}, seen
    (fresh,), = query(db, "SELECT now() - last_heartbeat_at < interval '2 seconds' FROM deployments_worker "
                          "WHERE name = %s", worker)
    assert fresh  # heartbeats got through again by themselves
    stats = query(db, "SELECT stats FROM deployments_worker WHERE name = %s", worker)[0][0]
    assert stats["engine_builds"] == 1 and stats["tasks"].get("load_model") == 1, stats
    assert query(db, "SELECT id FROM deployments_replica") == [(replica_id,)]

    celery_lines, agent_lines = _lines(celery)[celery_before:], _lines(agent)[agent_before:]
    print(f"log lines over the outage and after: celery {len(celery_lines)}, worker {len(agent_lines)}")
    assert not [line for line in celery_lines if "Traceback" in line], "\n".join(celery_lines[:80])
    # (Celery's worker prints each of our JSON lines a second time in its own format: count the JSON ones.)
    json_lines = [line for line in celery_lines if line.startswith("{")]
    assert sum('"the database (reconciler) unavailable"' in line for line in json_lines) == 1, "\n".join(json_lines)
    assert any("reconciler resumed after a gap" in line for line in celery_lines)
    assert len(celery_lines) < 40, "\n".join(celery_lines)
    # The worker: one line when its heartbeats start failing, one when they get through (its logs print twice).
    failing = [line for line in agent_lines if "heartbeat" in line]
    assert sum("the control plane is unavailable" in line for line in failing if line.startswith("{")) == 1, \
        "\n".join(agent_lines)
    assert len(failing) <= 4, "\n".join(agent_lines)
