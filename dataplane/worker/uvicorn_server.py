"""The uvicorn server with the worker's SIGTERM drain (see entry.py for why), and its timeouts.

Shared by the plain worker (entry.py) and the managed one (agent/__main__.py); its own module so
neither entry point imports the other.
"""

from __future__ import annotations

import asyncio
from types import FrameType

import uvicorn

from dataplane.worker.state import WorkerState

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
