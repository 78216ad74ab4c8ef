"""Run a test module's selection again in a child pytest on the other database backend: SQLite when this
run has PostgreSQL (CI), PostgreSQL when this run has SQLite and a server answers. For the fuzzers,
whose finds differ by backend (PostgreSQL refuses NUL bytes and out-of-range integers; SQLite has its
own "datatype mismatch")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_on_other_database(settings, module: str, *, selection: str, child_flag: str) -> None:
    """`module`: the test file; `selection`: its `-k` expression; `child_flag`: an environment variable
    set in the child, so that its own copy of the calling test skips instead of starting another."""
    from controlplane.settings.test import _postgres_up

    env = {**os.environ, child_flag: "1"}
    env.pop("DATABASE_URL", None)
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        env["TESSERA_TEST_DATABASE"] = "sqlite"
    elif _postgres_up() or os.environ.get("TESSERA_REQUIRE_SERVICES") == "1":
        env["TESSERA_TEST_DATABASE"] = "postgresql"
    else:
        pytest.skip("no PostgreSQL server answers for the second run")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600", str(Path(module).resolve()),
         "-k", selection],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
