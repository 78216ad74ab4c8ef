"""Throwaway PostgreSQL and Redis servers that a test may stop, start, hang and kill.

The suite's own services (PostgreSQL on 5432, Redis on 6379, RabbitMQ) are shared by every test
and every engineer on the machine, so a fault test never touches them: it starts its own server
from the binaries on the development and CI machines (`initdb`/`pg_ctl`, `redis-server`) on a
spare port in a temporary directory, and does to it what an outage would.

    from tests.throwaway_services import throwaway_postgres, throwaway_redis  # noqa: F401 (fixtures)

    def test_x(throwaway_postgres):
        url = throwaway_postgres.url          # postgres://postgres@127.0.0.1:<port>/tessera
        throwaway_postgres.stop()             # fast shutdown: connections drop, new ones are refused
        throwaway_postgres.start()            # same port, same data
        throwaway_postgres.pause()            # SIGSTOP: the server accepts nothing and answers nothing
        throwaway_postgres.resume()

`ThrowawayPostgres.migrate()` applies the project's migrations to its database (a control plane in a
subprocess can then run on it). A fixture's server is removed (data directory included) afterwards.
initdb refuses to run as root, so as root the server runs as the `postgres` user on a directory
chowned to it.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.dataplane.worker.process import free_port

ROOT = Path(__file__).resolve().parents[1]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        time.sleep(0.1)


def postgres_bin() -> Path | None:
    """The directory holding initdb and pg_ctl (the newest installed version), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class ThrowawayPostgres:
    """A PostgreSQL cluster of its own (trust auth, loopback only) with one database, `tessera`."""

    database = "tessera"

    def __init__(self) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError("initdb is not installed")
        self.bindir = bindir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tessera-pg-"))
        self.data = self.dir / "data"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", self.database)

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bindir / tool), *args]
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, cwd=self.dir)

    def start(self) -> None:
        # Unix socket in our own directory: never the system one; fsync off: nothing here must survive a crash.
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-o", options, "-w", "start")
        _wait(self.answers, 20, "the throwaway PostgreSQL did not answer")

    def stop(self, mode: str = "fast") -> None:
        """`fast`: sessions are ended and the server exits; `immediate`: as if it crashed."""
        self.resume()
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def _postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections hang instead of failing, like a network partition."""
        os.kill(self._postmaster_pid(), signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        if getattr(self, "_paused", False):
            os.kill(self._postmaster_pid(), signal.SIGCONT)
            self._paused = False

    def answers(self) -> bool:
        import psycopg

        try:
            # The maintenance database: `tessera` does not exist until created.
            with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                                 connect_timeout=1) as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)
        except psycopg.Error:
            return False

    def migrate(self) -> None:
        """Apply the project's migrations to `tessera` (a subprocess: the test process's Django is untouched)."""
        env = {**os.environ, "DATABASE_URL": self.url, "DJANGO_SETTINGS_MODULE": "controlplane.settings.base",
               "TESSERA_VAR_DIR": str(self.dir / "var")}
        done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed:\n{done.stdout}\n{done.stderr}")

    def log(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


class ThrowawayRedis:
    """A `redis-server` of its own (no persistence): a killed one comes back empty, as after a failover."""

    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(self.answers, 10, "the throwaway redis-server did not answer")

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=0.2, socket_timeout=0.5).ping())
        except redis.exceptions.RedisError:
            return False


@pytest.fixture
def throwaway_postgres():
    """A fresh PostgreSQL cluster on a spare port (empty database `tessera`; call `.migrate()` for the schema)."""
    if postgres_bin() is None:
        pytest.skip("initdb is not installed")
    server = ThrowawayPostgres()
    yield server
    server.destroy()


@pytest.fixture
def throwaway_redis():
    """A fresh redis-server on a spare port, killed afterwards."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = ThrowawayRedis()
    yield server
    server.stop()
