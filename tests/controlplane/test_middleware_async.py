"""Every middleware runs in async mode: one sync-only middleware makes Django adapt the whole stack, and
the management API's async views then run in one thread, one request at a time (the gateway's
concurrency tests through Django's handler served 38 of a budget for 10 that way)."""

from django.conf import settings
from django.utils.module_loading import import_string


def test_every_middleware_is_async_capable():
    sync_only = [path for path in settings.MIDDLEWARE if not getattr(import_string(path), "async_capable", False)]
    assert sync_only == []
