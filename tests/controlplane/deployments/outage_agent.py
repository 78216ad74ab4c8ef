"""`python -m tests.controlplane.deployments.outage_agent`: a managed worker with no model, for fault tests.

The real agent (registration, heartbeats over the internal API, the Celery consumer of `worker.<id>`,
the real worker-side tasks with their idempotency checks) around an engine slot that builds nothing:
a load takes `TESSERA_STUB_LOAD_SECONDS` and counts as an engine build, so a test can tell how many
times a replica or an adapter was really loaded (Worker.stats: engine_builds, adapter_loads) without
SmolLM2's weights or the CPU time they cost. Settings come from the environment as for
`python -m dataplane.worker.agent` (tests/controlplane/deployments/live.py: Stack.add_worker).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import SimpleNamespace

from dataplane.worker.agent.agent import Agent
from dataplane.worker.agent.settings import AgentSettings
from dataplane.worker.agent.slot import EngineSlot, Loaded, fingerprint
from dataplane.worker.agent.tasks import TaskRunner
from dataplane.worker.drain import Drainer


class _Engine:
    latest_stats = None

    def is_alive(self) -> bool:
        return True


class StubSlot(EngineSlot):
    load_seconds = float(os.environ.get("TESSERA_STUB_LOAD_SECONDS", "0.2"))

    def ensure_model(self, spec: dict) -> str:
        fp = fingerprint(spec)
        with self.lock:
            if self.loaded is not None and self.loaded.replica_uid == spec["uid"] and self.loaded.fingerprint == fp:
                self.loaded.attempt = spec["attempt"]
                return "already-loaded"
            self.loading = {"replica_uid": spec["uid"], "attempt": spec["attempt"], "since": time.time()}
            time.sleep(self.load_seconds)
            self.state.engine, self._adapters = _Engine(), set()
            self.loaded = Loaded(spec["uid"], spec["attempt"], spec["served_name"], spec["model"]["source"], fp,
                                 self.load_seconds, None)
            self.counters["engine_builds"] += 1
            self.loading = None
            return "loaded"

    def unload(self, replica_uid: str | None = None) -> bool:
        with self.lock:
            if self.loaded is None or (replica_uid is not None and self.loaded.replica_uid != replica_uid):
                return False
            self.loaded, self.state.engine, self._adapters = None, None, set()
            self.counters["engine_shutdowns"] += 1
            return True

    def add_adapter(self, name: str, source: str, tenant: str | None = None) -> str:
        with self.lock:
            if name in self._adapters:
                return "already-loaded"
            self._adapters.add(name)
            self.counters["adapter_loads"] += 1
            return "loaded"

    def remove_adapter(self, name: str) -> bool:
        with self.lock:
            if name not in self._adapters:
                return False
            self._adapters.discard(name)
            self.counters["adapter_unloads"] += 1
            return True


def main() -> None:
    logging.basicConfig(level=logging.INFO)  # the agent's own JSON handler, if any, stays
    env = os.environ
    name = env["TESSERA_WORKER_ID"]
    settings = AgentSettings(
        control_plane_url=env["TESSERA_CONTROL_PLANE_URL"], worker_id=name, advertise_url=f"http://{name}.test:1",
        broker_url=env["TESSERA_BROKER_URL"], token=env.get("TESSERA_INTERNAL_TOKEN", ""),
        heartbeat_seconds=float(env.get("TESSERA_HEARTBEAT_SECONDS", "0.5")), memory_bytes=16 * 2**30)
    state = SimpleNamespace(engine=None, drainer=Drainer())
    agent = Agent(settings, state)
    agent.slot = StubSlot(state)
    agent.runner = TaskRunner(agent.client, agent.slot)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    agent.start()
    stopped.wait()
    agent.stop()


if __name__ == "__main__":
    main()
