"""Deployments fixtures: recorded task messages (no broker), registered workers, models, tenants."""

from __future__ import annotations

import uuid

import pytest

# Django models are imported inside fixtures: this conftest loads before Django is set up.


class Sent(list):
    """(task name, args, queue) tuples, in the order they were published."""

    def of(self, name: str) -> list[tuple[str, list, str | None]]:
        return [m for m in self if m[0] == name]


@pytest.fixture
def sent(monkeypatch):
    """Every task message the control plane publishes, recorded instead of sent to a broker."""
    from controlplane.deployments import dispatch

    messages = Sent()
    monkeypatch.setattr(dispatch, "send", lambda name, args, queue=None, expires=None: messages.append(
        (name, list(args), queue)))
    return messages


@pytest.fixture
def commit(django_capture_on_commit_callbacks):
    """Run what a block queued with transaction.on_commit (the test case's transaction never commits)."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def make_worker(db):
    from controlplane.deployments import services

    def make(name: str | None = None, *, accelerator: str = "cpu", memory_bytes: int = 16 * 2**30,
             labels: dict | None = None, status: str = "ready", device_count: int = 1):
        name = name or f"w-{uuid.uuid4().hex[:6]}"
        return services.worker_register(name=name, url=f"http://{name}.test:8100", boot_id="boot-1",
                                         accelerator=accelerator, memory_bytes=memory_bytes, labels=labels,
                                         status=status, device_count=device_count)

    return make


@pytest.fixture
def make_model(db):
    from controlplane.deployments import services

    def make(name: str = "smollm2-135m-instruct", **fields):
        return services.model_create(name=name, **fields)

    return make


@pytest.fixture
def make_tenant(db):
    from tenants import selectors, services

    def make(name: str | None = None):
        return services.tenant_create_with_key(name=name or f"T {uuid.uuid4().hex[:6]}",
                                               tier=selectors.tier_get(name="standard"))

    return make


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("op", password="pw", is_staff=True, is_superuser=True)


@pytest.fixture(autouse=True)
def adapter_root(settings, tmp_path):
    """The operator's adapter store: tenant T's adapters live under <root>/T/ (adapter_store.py)."""
    root = tmp_path / "adapter-store"
    root.mkdir()
    settings.TESSERA_ADAPTER_ROOT = str(root)
    return root


@pytest.fixture(scope="module")
def live_test_database(django_db_setup, django_db_blocker):
    """The test database for a module of live processes (its `stack` asks for this).

    pytest-django creates the test database only when a collected test carries a `django_db` mark;
    a live module run alone has none (see `live_database`), so the database is created here then and
    dropped when the module ends."""
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        if connection.settings_dict["NAME"] == connection.settings_dict["TEST"]["NAME"]:
            yield  # another module's marked tests made pytest-django create it
            return
        config = setup_databases(verbosity=0, interactive=False, aliases={"default"})
        try:
            yield
        finally:
            teardown_databases(config, verbosity=0)


@pytest.fixture
def live_database(stack, django_db_blocker):
    """Database access for a test beside a module's live processes, with no flush when it ends.

    `django_db(transaction=True)` flushes (TRUNCATE of every table) after each test while the
    module's Celery worker, beat and managed workers still write: on a loaded host the TRUNCATE lost
    a deadlock to them and the test errored in its teardown. The module's `stack` flushes once, after
    its processes are gone."""
    with django_db_blocker.unblock():
        yield
