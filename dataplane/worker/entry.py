"""Process entry: flags, logging, uvicorn, and the SIGTERM drain.

uvicorn's own SIGTERM handling closes the listening socket at once (new requests see connection
refused, `/ready` cannot be asked) and re-raises the signal after shutdown, so the process ends
by SIGTERM rather than with status 0. Here the first SIGTERM or SIGINT starts a drain instead:
new requests get 503 and `/ready` says 503 while in-flight ones finish (up to --drain-timeout);
then uvicorn shuts down and the process exits 0. A second signal exits at once.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from collections.abc import Sequence

import uvicorn

from dataplane.worker.config import load_config
from dataplane.worker.logs import setup_logging
from dataplane.worker.routes import create_app
from dataplane.worker.state import WorkerState
from dataplane.worker.threads import apply_threads
from dataplane.worker.uvicorn_server import GRACEFUL_SHUTDOWN_SECONDS, KEEP_ALIVE_SECONDS, WorkerServer

log = logging.getLogger("tessera.worker")


def main(argv: Sequence[str] | None = None) -> int:
    if os.environ.get("TESSERA_CONTROL_PLANE_URL"):  # managed: registers, starts idle, loads what it is told
        # lazy: the agent (Celery, the control-plane client) loads only in a managed worker
        from dataplane.worker.agent.__main__ import main as managed_main

        return managed_main(argv)
    try:
        config = load_config(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    apply_threads(config)
    if not config.token and not _is_loopback(config.host):
        log.warning("listening beyond loopback without a worker token", extra={"host": config.host})
    state = WorkerState(config)
    server = WorkerServer(uvicorn.Config(
        create_app(state), host=config.host, port=config.port, log_config=None, access_log=False, lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_SECONDS, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS), state)
    state.on_fatal = server.fatal
    server.run()
    return server.exit_code


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
