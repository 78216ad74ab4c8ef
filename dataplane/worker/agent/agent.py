"""The agent: registration, heartbeats and the Celery consumer, inside the data-plane worker process.

Why in-process: the tasks act on this process's `AsyncLLM` directly (no admin HTTP surface to
secure, no second process to outlive the worker when it is killed). The consumer is Celery's own
`WorkController` on a thread, consuming only `worker.<id>`, with a one-thread pool: tasks for
this worker run one at a time, in order, and the consumer keeps talking to the broker while a
load runs. Without remote control, gossip, mingle and events, it needs no broadcast exchange.

Why HTTP to the control plane rather than its database: a GPU host gets no database credentials.
Registration and heartbeats go to `POST /internal/v1/workers/...` with the internal token
(TESSERA_INTERNAL_TOKEN); the registration is bound to this process's boot id, sent on every call
(X-Tessera-Boot-Id), and released on a clean stop. A heartbeat answered 404/409 (unknown worker,
or the control plane saw another boot) registers again; a registration refused because the name
is still held by a previous boot (a crash) is retried every beat until that one expires. On drain (SIGTERM) the heartbeat says `draining`, the consumer stops taking tasks, and
the control plane moves this worker's replicas elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid

from celery.worker import WorkController
from kombu.asynchronous import set_event_loop

from dataplane.worker.routes import WorkerState

from . import tasks
from .client import ControlPlaneClient, ControlPlaneRejected, ControlPlaneUnavailable, NotRegistered
from .settings import AgentSettings
from .slot import EngineSlot

log = logging.getLogger("tessera.worker.agent")
RESTART_CONSUMER_SECONDS = 2.0
logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat otherwise


class _Consumer(WorkController):
    def __init__(self, *args, ready: threading.Event, **kwargs) -> None:
        self._ready_event = ready
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer) -> None:  # noqa: ANN001
        self._ready_event.set()


class Agent:
    def __init__(self, settings: AgentSettings, state: WorkerState, client: ControlPlaneClient | None = None) -> None:
        self.settings = settings
        self.state = state
        self.boot_id = uuid.uuid4().hex
        self.client = client or ControlPlaneClient(settings.control_plane_url, settings.worker_id, settings.token,
                                                   boot_id=self.boot_id)
        self.slot = EngineSlot(state, unload_grace_seconds=settings.unload_grace_seconds,
                               model_cache=settings.model_cache, adapter_root=settings.adapter_root)
        self.runner = tasks.TaskRunner(self.client, self.slot)
        self.registered = False
        self.consumer_ready = threading.Event()
        self._stop = threading.Event()
        self._consumer: _Consumer | None = None
        self._threads: list[threading.Thread] = []
        self.heartbeat_seconds = settings.heartbeat_seconds
        self._heartbeat_outage = _OutageLog()

    # --- the worker's hooks -----------------------------------------------------------------------
    def install(self) -> None:
        """Take over loading: the server's startup binds the loop and loads nothing (deferred load)."""
        self.state.load = self._bind_loop  # the lifespan awaits state.load() once the server runs

    async def _bind_loop(self) -> None:
        self.slot.loop = asyncio.get_running_loop()
        log.info("worker idle until the control plane assigns a replica",
                 extra={"worker": self.settings.worker_id, "queue": self.settings.queue})

    def start(self) -> None:
        tasks.install(self.runner)
        tasks.app.conf.update(
            broker_url=self.settings.broker_url, broker_transport_options=self.settings.broker_transport_options,
            task_acks_late=True, worker_prefetch_multiplier=1, worker_enable_remote_control=False,
            worker_send_task_events=False, task_default_queue=self.settings.queue, worker_hijack_root_logger=False,
            broker_connection_retry_on_startup=True, accept_content=["json"], task_serializer="json",
            broker_connection_max_retries=None,  # never give up on the broker (Celery's default: 100 tries, then stop)
            # A load can take minutes: do not let a lost connection cancel it (acks_late redelivers anyway).
            worker_cancel_long_running_tasks_on_connection_loss=False,
        )
        self._spawn(self._consume, "tessera-agent-consumer")
        self._spawn(self._heartbeat_loop, "tessera-agent-heartbeat")

    def stop(self) -> None:
        self._stop.set()
        self._stop_consumer()
        # Short joins: over AMQP the consumer's loop notices a stop only at its next broker heartbeat
        # (~10 s). Nothing is lost by not waiting: a task still running was not acked (acks_late) and
        # the broker hands it out again; these are daemon threads and the process is exiting.
        for thread in self._threads:
            thread.join(timeout=2)
        try:
            if self.registered:
                self.client.heartbeat(self._heartbeat_body(status="draining"))
                self.client.release()  # the name is free for this worker's next boot at once
        except (ControlPlaneUnavailable, ControlPlaneRejected):
            pass
        tasks.install(None)
        self.client.close()

    # --- threads ----------------------------------------------------------------------------------
    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _consume(self) -> None:
        while True:
            # A fresh event loop for every consumer: Celery's Hub step reuses kombu's process-wide loop
            # when anything in the process has set one, and a stopped consumer has closed that loop.
            set_event_loop(None)
            self._consumer = _Consumer(
                app=tasks.app, hostname=f"agent@{self.settings.worker_id}", pool_cls="threads", concurrency=1,
                queues=[self.settings.queue], without_mingle=True, without_gossip=True, without_heartbeat=True,
                ready=self.consumer_ready)
            try:
                self._consumer.start()
            except Exception:  # noqa: BLE001 - the heartbeat says `starting` until a new consumer is ready
                log.exception("task consumer stopped")
            if self._stop.is_set() or self.state.drainer.draining:
                return
            # Stopped by itself: Celery ends its consumer on an "unrecoverable" error, e.g. kombu's Redis
            # transport when the broker drops while a message is unacknowledged. Without a new one this
            # worker would heartbeat `ready` and never take another task.
            self.consumer_ready.clear()
            log.warning("task consumer stopped by itself; starting a new one", extra={"queue": self.settings.queue})
            self._stop.wait(RESTART_CONSUMER_SECONDS)
            if self._stop.is_set():
                return

    def _stop_consumer(self) -> None:
        consumer = self._consumer
        if consumer is not None:
            try:
                consumer.stop(in_sighandler=False)
            except Exception:  # noqa: BLE001
                log.exception("stopping the task consumer failed")
            self._consumer = None

    def _heartbeat_loop(self) -> None:
        draining_seen = False
        while not self._stop.is_set():
            try:
                if not self.registered:
                    self._register()
                answer = self.client.heartbeat(self._heartbeat_body())
                self.heartbeat_seconds = float(answer.get("heartbeat_seconds") or self.heartbeat_seconds)
                self._heartbeat_outage.succeeded()
            except NotRegistered:
                self.registered = False  # register again on the next beat
            except (ControlPlaneUnavailable, ControlPlaneRejected) as exc:
                self._heartbeat_outage.failed(exc)
            except Exception:  # noqa: BLE001 - never let the heartbeat thread die
                log.exception("heartbeat failed")
            if self.state.drainer.draining and not draining_seen:
                draining_seen = True
                self._stop_consumer()  # take no new work while draining
            self._stop.wait(self.heartbeat_seconds)

    def _register(self) -> None:
        answer = self.client.register({
            "url": self.settings.advertise_url, "boot_id": self.boot_id, "accelerator": self.settings.accelerator,
            "memory_bytes": self.settings.memory_bytes, "device_count": self.settings.device_count,
            "labels": self.settings.labels, "status": self._status()})
        self.registered = True
        self.heartbeat_seconds = float(answer.get("heartbeat_seconds") or self.heartbeat_seconds)
        log.info("registered with the control plane", extra={"worker": self.settings.worker_id,
                                                             "url": self.settings.advertise_url,
                                                             "queue": self.settings.queue})

    def _status(self) -> str:
        if self.state.drainer.draining or self._stop.is_set():
            return "draining"
        return "ready" if self.consumer_ready.is_set() else "starting"

    def _heartbeat_body(self, status: str | None = None) -> dict:
        engine = self.state.engine
        stats = engine.latest_stats if engine is not None else None
        return {
            "boot_id": self.boot_id, "status": status or self._status(), "slot": self.slot.snapshot(),
            "adapters": self.slot.adapters(),
            "running": getattr(stats, "num_running", 0) or 0, "waiting": getattr(stats, "num_waiting", 0) or 0,
            "kv_cache_usage": float(getattr(stats, "kv_cache_usage", 0.0) or 0.0),
            "stats": {**self.slot.counters, "tasks": dict(self.runner.received), "inflight": self.state.drainer.inflight,
                      "max_num_seqs": _seats(engine), "at": time.time()},
        }


class _OutageLog:
    """Heartbeats that fail while the control plane is away: one line when they start failing, one a
    minute, one when they get through again (not one per beat: a few seconds of outage was a page of log)."""

    every = 60.0

    def __init__(self) -> None:
        self.since: float | None = None
        self.last_line = 0.0
        self.failures = 0

    def failed(self, exc: Exception) -> None:
        now = time.monotonic()
        self.failures += 1
        if self.since is None:
            self.since = self.last_line = now
            log.warning("heartbeat failed; the control plane is unavailable", extra={"error": str(exc)})
        elif now - self.last_line >= self.every:
            self.last_line = now
            log.warning("heartbeats still failing", extra={"error": str(exc), "failures": self.failures,
                                                           "seconds": round(now - self.since, 1)})

    def succeeded(self) -> None:
        if self.since is not None:
            log.warning("heartbeats delivered again", extra={"failures": self.failures,
                                                             "seconds": round(time.monotonic() - self.since, 1)})
            self.since, self.failures = None, 0


def _seats(engine) -> int:  # noqa: ANN001
    """The engine's max_num_seqs (the gateway's admission estimate needs it); 0 when idle."""
    try:
        return int(engine.core.scheduler.config.max_num_seqs)
    except AttributeError:
        return 0
