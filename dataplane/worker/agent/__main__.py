"""`python -m dataplane.worker.agent [worker flags]`: a worker managed by the control plane.

The same process as `python -m dataplane.worker` (same flags, same HTTP API, same drain), but it
starts with no model: the control plane's `load_model` task decides what it serves. `--model` is
optional here; until a replica is assigned it is only the name `/v1/models` shows.
"""

from __future__ import annotations

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

from .agent import Agent
from .settings import AgentSettings

log = logging.getLogger("tessera.worker.agent")

UNASSIGNED = "unassigned"  # the model name an idle worker reports


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--model" not in argv and not os.environ.get("TESSERA_WORKER_MODEL"):
        argv += ["--model", UNASSIGNED]
    try:
        config = load_config(argv)
        settings = AgentSettings.from_env(config)
        if settings is None:
            raise ValueError("TESSERA_CONTROL_PLANE_URL: required for a managed worker (the control plane's base URL)")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    apply_threads(config)
    state = WorkerState(config)
    agent = Agent(settings, state)
    agent.install()
    server = WorkerServer(uvicorn.Config(
        create_app(state), host=config.host, port=config.port, log_config=None, access_log=False, lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_SECONDS, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS), state)
    state.on_fatal = server.fatal
    agent.start()
    try:
        server.run()
    finally:
        agent.stop()
    return server.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
