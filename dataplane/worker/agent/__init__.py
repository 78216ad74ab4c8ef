"""The data-plane worker's agent: registration, heartbeats, and the Celery consumer for `worker.<id>`.

`python -m dataplane.worker.agent [worker flags]` (or `python -m dataplane.worker` with
TESSERA_CONTROL_PLANE_URL set) runs a managed worker: it starts idle, registers with the control
plane, heartbeats its load, and loads what the `load_model` / `load_adapter` tasks assign. See
docs/deployments.md.
"""

from .agent import Agent
from .settings import AgentSettings

__all__ = ["Agent", "AgentSettings"]
