"""Process entry: flags, logging, uvicorn, and the SIGTERM drain.

uvicorn's own SIGTERM handling closes the listening socket at once (new requests see connection
refused, `/ready` cannot be asked) and re-raises the signal after shutdown, so the process ends
by SIGTERM rather than with status 0. Here the first SIGTERM or SIGINT starts a drain instead:
new requests get 503 and `/ready` says 503 while in-flight ones finish (up to --drain-timeout);
then uvicorn shuts down and the process exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn

from dataplane.worker.app import WorkerState, create_app
from dataplane.worker.config import load_config
from dataplane.worker.logs import setup_logging

log = logging.getLogger("tessera.worker")

# Longer than the gateway's pooled keep-alive (60 s), so the worker never closes a connection the
# gateway is about to reuse.
KEEP_ALIVE_SECONDS = 75
# After a drain, what is left is idle keep-alive connections (or, after a drain timeout, streams
# that uvicorn then cancels, which aborts them in the engine).
GRACEFUL_SHUTDOWN_SECONDS = 2


class WorkerServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: WorkerState) -> None:
        super().__init__(config)
        self.state = state
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = False  # set in the signal handler itself, so a second signal sees it
        self._drain: asyncio.Task | None = None  # held so the task is not collected

    async def startup(self, sockets=None) -> None:  # noqa: ANN001
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown.
        if self._loop is None or not self.started or self._drain_requested:
            self.force_exit = self._drain_requested
            self.should_exit = True
            return
        self._drain_requested = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        await self.state.drainer.drain(self.state.config.drain_timeout)
        self.should_exit = True

    def fatal(self) -> None:
        """Loading failed: stop serving and exit non-zero."""
        self.exit_code = 1
        self.should_exit = True


def main(argv: Sequence[str] | None = None) -> int:
    if os.environ.get("TESSERA_CONTROL_PLANE_URL"):  # managed: registers, starts idle, loads what it is told
        from dataplane.worker.agent.__main__ import main as managed_main

        return managed_main(argv)
    try:
        config = load_config(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
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
