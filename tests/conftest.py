"""Suite-wide fixtures: which real services are reachable, and whether a missing one skips or fails.

`make test` skips only the tests whose service is missing and says so; CI sets
TESSERA_REQUIRE_SERVICES=1 so a missing service fails instead of skipping.
"""

from __future__ import annotations

import os
import socket

import pytest

# Worker processes the tests start skip the start-up warm-up (seconds of throwaway steps per worker);
# tests/dataplane/worker/test_warmup_process.py turns it on where it is the subject.
os.environ.setdefault("TESSERA_WORKER_WARMUP", "false")

SERVICES = {
    "postgres": ("127.0.0.1", 5432),
    "redis": ("127.0.0.1", 6379),
    "rabbitmq": ("127.0.0.1", 5672),
}


def service_up(name: str) -> bool:
    host, port = SERVICES[name]
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require_service(name: str) -> None:
    """Skip (locally) or fail (CI) the calling test when `name` does not answer."""
    if service_up(name):
        return
    message = f"{name} is not reachable on {SERVICES[name][0]}:{SERVICES[name][1]}"
    if os.environ.get("TESSERA_REQUIRE_SERVICES") == "1":
        pytest.fail(message + " and TESSERA_REQUIRE_SERVICES=1", pytrace=False)
    pytest.skip(message)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name in SERVICES:
        if item.get_closest_marker(name) is not None:
            require_service(name)


# --- Django (control plane) -------------------------------------------------------------------
# Settings for every test run; pytest-django finishes the set-up in its own (trylast) configure.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.test")


def pytest_configure(config: pytest.Config) -> None:
    try:
        from django.conf import settings

        settings.INSTALLED_APPS  # noqa: B018  (loads the settings so pytest-django sets Django up)
    except ImportError:
        pass
    # The C++ CPU kernels compile on first use (30-60 s on a fresh host, then cached per CPU): once
    # here, so that no test's clock (a worker process's start-up wait) pays for it.
    from kernels.cpu_ext import extension

    extension()


@pytest.fixture
def redis_url() -> str:
    """A Redis URL for limiter tests (the test must be marked `redis`)."""
    return os.environ.get("TESSERA_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def make_user(db, django_user_model):
    """A Django user holding `role` ("operator", "finance" or None) the way `manage.py role_grant` gives it."""

    def make(username: str, *, role: str | None = None, **fields):
        from tenants.roles import role_grant

        user = django_user_model.objects.create_user(username, password="pw", **fields)
        if role:
            role_grant(user=user, role=role)
        return django_user_model.objects.get(pk=user.pk)  # no stale permission cache

    return make
