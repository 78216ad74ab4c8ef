"""Gateway fixtures: two fake OpenAI-shaped workers (real HTTP servers), tenants with keys, and a
live gateway (uvicorn running controlplane.asgi in a thread) for tests that need a real socket."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from .fake_worker import FakeWorker, ServerThread


@pytest.fixture(scope="session")
def fake_workers():
    workers, servers = [], []
    for _ in range(2):
        worker = FakeWorker()
        server = ServerThread(worker)
        worker.port = server.start()
        workers.append(worker)
        servers.append(server)
    yield workers
    for server in servers:
        server.stop()


@pytest.fixture
def workers(fake_workers):
    for worker in fake_workers:
        worker.reset()
    return fake_workers


@pytest.fixture
async def _settle_accounting():
    """Wait, at teardown, for the accounting the test's last requests spawned (settle, price, write
    usage). Requested by `gateway`, so this runs before the settings are restored and before the
    database is flushed: a straggler would otherwise write through the default (billing) sink while
    the flush truncates its tables, and the flush fails."""
    yield
    from controlplane.gateway.usage import accounting

    await accounting.drain()


@pytest.fixture
def gateway(settings, workers, transactional_db, _settle_accounting):
    """Settings for a gateway in front of the fake workers, with the database limiter."""
    from controlplane.gateway.routing import workers as registry_module
    from controlplane.gateway.usage import accounting
    from tenants import auth
    from tenants.limits import reset_limiter

    from . import sink

    settings.TESSERA_WORKERS = ",".join(w.url for w in workers)
    settings.TESSERA_WORKER_TOKEN = "worker-secret"
    settings.TESSERA_USAGE_SINK = "tests.controlplane.sink.collect"
    settings.TESSERA_LIMITER = "database"
    settings.TESSERA_AUTH_CACHE_SECONDS = 0.0
    registry_module._registry = None
    reset_limiter()
    auth.cache_clear()
    accounting._rates.clear()  # cached price rates from an earlier test's price book
    sink.clear()
    yield settings
    registry_module._registry = None
    reset_limiter()


@pytest.fixture
def use_redis_limiter(gateway, redis_url):
    from tenants.limits import reset_limiter

    gateway.TESSERA_LIMITER = "redis"
    gateway.REDIS_URL = redis_url
    gateway.TESSERA_REDIS_PREFIX = f"tsrtest-{uuid.uuid4().hex[:10]}"
    reset_limiter()


@pytest.fixture
def tenant_key(gateway):
    """await make(tier fields..., key_fields=..., tenant_fields=...) -> (tenant, secret)."""
    from asgiref.sync import sync_to_async

    from tenants import services

    def make_sync(*, tenant_fields=None, key_fields=None, **tier_fields):
        tier_fields.setdefault("priority", 7)
        tier = services.tier_create(name=f"tier-{uuid.uuid4().hex[:8]}", **tier_fields)
        tenant = services.tenant_create(name=f"Tenant {uuid.uuid4().hex[:8]}", tier=tier, **(tenant_fields or {}))
        created = services.api_key_create(tenant=tenant, name="test", **(key_fields or {}))
        return tenant, created.secret

    async def make(**kwargs):
        return await sync_to_async(make_sync)(**kwargs)

    make.sync = make_sync
    return make


@pytest.fixture
async def drain():
    from controlplane.gateway.usage import accounting

    return accounting.drain


@pytest.fixture
def live_gateway(gateway):
    """The ASGI application served by uvicorn on a free port; yields its base URL."""
    from controlplane.asgi import application

    server = ServerThread(application)
    port = server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(autouse=True)
async def _close_thread_connections():
    """Async tests reach the ORM through sync_to_async's shared thread; close its connection
    afterwards, or the test database cannot be dropped."""
    yield
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(connections.close_all)()


@contextlib.contextmanager
def serving_gateway(settings, worker):
    """The deployed ASGI app (uvicorn in a thread, free port) in front of a real worker process
    (tests/dataplane/worker/process.py); yields the gateway's base URL."""
    from controlplane.asgi import application
    from tests.dataplane.worker.process import TOKEN

    settings.TESSERA_WORKERS = worker.url
    settings.TESSERA_WORKER_TOKEN = TOKEN
    server = ServerThread(application)
    port = server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def database_switch():
    """`.away()` points every thread's next database connection at a port nobody listens on (a database
    that is down, as its clients see it); `.back()` undoes it, as does the end of the test."""
    from django.db import connections

    from tests.dataplane.worker.process import free_port

    if connections["default"].vendor != "postgresql":
        pytest.skip("a network database")
    settings_dict = connections.settings["default"]
    port = settings_dict["PORT"]

    class Switch:
        @staticmethod
        def away() -> None:
            connections.close_all()
            settings_dict["PORT"] = str(free_port())

        @staticmethod
        def back() -> None:
            settings_dict["PORT"] = port

    yield Switch
    connections.close_all()
    settings_dict["PORT"] = port
