"""Test settings: PostgreSQL when it answers (always under TESSERA_REQUIRE_SERVICES=1), else SQLite."""

import os
import socket
import tempfile
from pathlib import Path

from .base import *  # noqa: F401,F403
from .base import VAR_DIR


def _postgres_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=0.5):
            return True
    except OSError:
        return False


_wanted = os.environ.get("TESSERA_TEST_DATABASE", "")  # "sqlite" forces the fallback locally

if os.environ.get("DATABASE_URL"):
    pass  # base already parsed it
elif _wanted != "sqlite" and (os.environ.get("TESSERA_REQUIRE_SERVICES") == "1" or _postgres_up()):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "test",
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": "5432",
            # Several engineers and CI jobs share one server: a per-process test database name.
            "TEST": {"NAME": os.environ.get("TESSERA_TEST_DB_NAME", f"test_tessera_{os.getpid()}")},
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "controlplane.db.sqlite3",
            "NAME": str(VAR_DIR / "test.sqlite3"),
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"},
            "TEST": {"NAME": str(VAR_DIR / f"test_{os.getpid()}.sqlite3")},
        }
    }

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SECRET_KEY = "test-secret-key"
TESSERA_API_KEY_SECRET = "test-api-key-secret"
TESSERA_AUTH_CACHE_SECONDS = 0.0
TESSERA_GC_FREEZE = False  # in-process test servers share pytest's heap: freezing it would keep its garbage
TESSERA_WORKERS = ""
# Each test process spools into its own directory: one run must never replay another's usage.
TESSERA_USAGE_SPOOL_DIR = Path(tempfile.mkdtemp(prefix="tessera-spool-"))
# Off by default: many tests send bad keys from 127.0.0.1 on purpose; tests/controlplane/test_auth_throttle*.py
# turn it on.
TESSERA_AUTH_FAILURES_PER_MINUTE = 0
# The test database starts with an empty price book (tests price what they bill); billing's own tests
# seed the default list price themselves.
BILLING_DEFAULT_LIST_PRICE = ""
# Nothing collected: the test client and live_server never serve static files through WhiteNoise (the
# browser tests that check the admin's styles run the real server on a collected tree).
STATIC_ROOT = Path(tempfile.mkdtemp(prefix="tessera-static-"))
