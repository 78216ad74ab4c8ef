"""The worker agent's task logic without a broker or a model: a scripted control plane, a fake engine."""

from __future__ import annotations

import threading
import types

import pytest

from dataplane.worker.agent import slot as slot_module
from dataplane.worker.agent import tasks
from dataplane.worker.agent.client import ControlPlaneUnavailable, Gone
from dataplane.worker.agent.settings import AgentSettings, parse_labels
from dataplane.worker.agent.slot import EngineSlot
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState


class FakeEngine:
    def __init__(self, source: str) -> None:
        self.source, self.alive, self.latest_stats, self._streams = source, True, None, {}
        self.adapters: dict[str, str] = {}

        self.warmed_up = False
        self.built_on = threading.current_thread()

    def is_alive(self) -> bool:
        return self.alive

    async def warm_up(self):
        self.warmed_up = True
        return types.SimpleNamespace(seconds=0.0, steps=0, prefill_sizes=[])

    def shutdown(self) -> None:
        self.alive = False

    async def add_adapter(self, name: str, path: str) -> None:
        self.adapters[name] = path

    async def remove_adapter(self, name: str) -> None:
        del self.adapters[name]


class ScriptedControlPlane:
    def __init__(self) -> None:
        self.specs: dict[int, dict] = {}
        self.placements: dict[int, dict] = {}
        self.reports: list[tuple[int, dict]] = []
        self.fail_reports = 0

    def replica(self, replica_id: int) -> dict:
        if replica_id not in self.specs:
            raise Gone(str(replica_id))
        return self.specs[replica_id]

    def report_replica(self, replica_id: int, body: dict) -> dict:
        if self.fail_reports:
            self.fail_reports -= 1
            raise ControlPlaneUnavailable("down")
        self.reports.append((replica_id, body))
        return {"applied": True}

    def placement(self, placement_id: int) -> dict:
        return self.placements[placement_id]

    def report_placement(self, placement_id: int, body: dict) -> dict:
        self.reports.append((placement_id, body))
        return {"applied": True}


def spec(replica_id=1, attempt=1, source="smollm2-135m-instruct", status="loading", quantization=None, uid=None):
    return {"id": replica_id, "uid": uid or f"uid-{replica_id}", "attempt": attempt, "status": status,
            "served_name": "smollm2-135m-instruct", "engine_quantization": quantization, "engine_args": {},
            "max_adapters": 0, "model": {"source": source, "base_source": source}}


@pytest.fixture
def agent(monkeypatch):
    monkeypatch.setattr("dataplane.worker.state.Serving", lambda engine, config, *rest: types.SimpleNamespace(
        engine=engine, config=config))  # the HTTP layer is not under test here
    state = WorkerState(WorkerConfig(model="unassigned"))
    slot = EngineSlot(state, unload_grace_seconds=0.1)
    built: list[FakeEngine] = []

    def build(source, spec):
        slot.counters["engine_builds"] += 1
        built.append(FakeEngine(source))
        return built[-1]

    monkeypatch.setattr(slot, "_build", build)
    control = ScriptedControlPlane()
    runner = tasks.TaskRunner(control, slot)
    return types.SimpleNamespace(state=state, slot=slot, control=control, runner=runner, built=built)


def test_a_duplicate_load_loads_nothing_twice(agent):
    agent.control.specs[1] = spec()
    assert agent.runner.load_model(1, 1) == "loaded"
    assert agent.runner.load_model(1, 1) == "already-loaded"
    agent.control.specs[1] = spec(attempt=2)  # re-placed on this worker with the same spec: adopt, do not reload
    assert agent.runner.load_model(1, 2) == "already-loaded"
    assert agent.slot.counters["engine_builds"] == 1
    assert [body["status"] for _, body in agent.control.reports] == ["ready", "ready", "ready"]
    assert agent.state.config.model_id == "smollm2-135m-instruct" and agent.state.serving is not None
    assert agent.slot.snapshot()["state"] == "ready" and agent.slot.snapshot()["attempt"] == 2


def test_a_load_warms_the_engine_up_before_it_reports_ready_unless_the_worker_says_not_to(agent):
    agent.state.config.warmup = True
    agent.control.specs[1] = spec()
    assert agent.runner.load_model(1, 1) == "loaded"
    assert agent.built[-1].warmed_up
    # built on a thread that exits (dataplane/engine/passing_thread.py), not the task's own thread
    assert agent.built[-1].built_on is not threading.current_thread() and not agent.built[-1].built_on.is_alive()
    agent.state.config.warmup = False
    agent.control.specs[2] = spec(replica_id=2)
    assert agent.runner.load_model(2, 1) == "loaded"
    assert not agent.built[-1].warmed_up


def test_stale_or_unwanted_messages_do_nothing(agent):
    agent.control.specs[1] = spec(attempt=3)
    assert agent.runner.load_model(1, 2).startswith("skipped: attempt 2 is stale")
    agent.control.specs[1] = spec(status="stopping")
    assert agent.runner.load_model(1, 1) == "skipped: replica is stopping"
    assert agent.runner.load_model(99, 1) == "skipped: replica gone"
    assert agent.slot.counters["engine_builds"] == 0 and agent.control.reports == []


def test_a_bad_source_fails_permanently_with_a_clear_reason_and_is_not_reloaded_on_a_report_retry(agent):
    agent.control.specs[1] = spec(source="/nope/model.gguf")
    agent.control.fail_reports = 1
    with pytest.raises(ControlPlaneUnavailable):  # Celery retries the task (autoretry_for)
        agent.runner.load_model(1, 1)
    assert agent.runner.load_model(1, 1) == "failed"
    (_, body), = agent.control.reports
    assert body["status"] == "failed" and body["permanent"] is True
    assert "'/nope/model.gguf' cannot be loaded here" in body["reason"]
    assert agent.slot.counters["load_failures"] == 1 and agent.slot.counters["engine_builds"] == 0


def test_object_store_sources_must_be_in_the_model_cache(agent, tmp_path):
    agent.slot.model_cache = tmp_path
    agent.control.specs[1] = spec(source="s3://models/smollm2/")
    assert agent.runner.load_model(1, 1) == "failed"
    assert "not in this worker's model cache" in agent.control.reports[0][1]["reason"]


def test_a_new_replica_replaces_the_engine_and_unload_stops_it(agent):
    agent.control.specs[1] = spec()
    agent.runner.load_model(1, 1)
    agent.control.specs[2] = spec(replica_id=2)
    assert agent.runner.load_model(2, 1) == "loaded"
    assert not agent.built[0].alive and agent.built[1].alive and agent.slot.counters["engine_shutdowns"] == 1
    agent.control.specs[2] = spec(replica_id=2, status="stopping")
    assert agent.runner.unload_model(2, 1) == "unloaded"
    assert agent.runner.unload_model(2, 1) == "not loaded"  # a duplicate
    assert agent.state.engine is None and agent.slot.snapshot() == {"state": "idle"}
    assert [b["status"] for _, b in agent.control.reports][-2:] == ["stopped", "stopped"]


def test_adapters_load_once_on_the_replica_they_were_placed_on(agent, tmp_path):
    (tmp_path / "acme" / "sql").mkdir(parents=True)
    agent.slot.adapter_root = str(tmp_path)
    agent.control.specs[1] = spec()
    agent.runner.load_model(1, 1)
    agent.control.placements[7] = {"id": 7, "attempt": 1, "status": "loading", "adapter": "acme:sql",
                                   "source": str(tmp_path / "acme" / "sql"), "rank": 8, "replica_uid": "uid-1",
                                   "tenant": "acme"}
    assert agent.runner.load_adapter(7, 1) == "loaded"
    assert agent.runner.load_adapter(7, 1) == "already-loaded"
    assert agent.built[0].adapters == {"acme:sql": str(tmp_path / "acme" / "sql")}
    assert agent.slot.adapters() == ["acme:sql"]
    agent.control.placements[8] = {**agent.control.placements[7], "id": 8, "replica_uid": "uid-other"}
    assert agent.runner.load_adapter(8, 1) == "failed"
    agent.control.placements[7]["status"] = "stopping"
    assert agent.runner.unload_adapter(7, 1) == "unloaded" and agent.built[0].adapters == {}


def test_quantized_replicas_serve_only_after_the_quality_gate(agent, monkeypatch):
    verdict = {"passed": False}
    monkeypatch.setattr(slot_module, "quality_gate", lambda candidate, baseline, method, quantization=None:
                        types.SimpleNamespace(passed=verdict["passed"], reason=f"{method} perplexity +9%"))
    agent.control.specs[1] = spec(quantization="fp8")
    assert agent.runner.load_model(1, 1) == "failed"
    body = agent.control.reports[-1][1]
    assert body["permanent"] and "quality gate failed for fp8" in body["reason"] and body["gate"]["passed"] is False
    assert agent.slot.counters["engine_builds"] == 0  # refused before it could serve
    verdict["passed"] = True
    agent.control.specs[1] = spec(quantization="fp8", attempt=2)
    assert agent.runner.load_model(1, 2) == "loaded"
    assert agent.control.reports[-1][1]["gate"] == {"passed": True, "reason": "fp8 perplexity +9%"}


def test_the_tasks_are_late_acked_with_bounded_retries():
    for task in (tasks.load_model, tasks.unload_model, tasks.load_adapter, tasks.unload_adapter):
        assert task.acks_late and task.max_retries == 5 and ControlPlaneUnavailable in task.autoretry_for
        assert task.name.startswith("deployments.")


def test_agent_settings_from_the_environment(tmp_path):
    config = WorkerConfig(model="x", port=8101, token="tok")
    assert AgentSettings.from_env(config, env={}) is None
    settings = AgentSettings.from_env(config, env={
        "TESSERA_CONTROL_PLANE_URL": "http://cp:8000/", "TESSERA_WORKER_ID": "gpu-0",
        "TESSERA_WORKER_LABELS": "zone=a, pool=big", "TESSERA_VAR_DIR": str(tmp_path),
        "TESSERA_INTERNAL_TOKEN": "internal"})
    assert settings.queue == "worker.gpu-0" and settings.control_plane_url == "http://cp:8000"
    # the internal API's own token, not the worker's --token (which the gateway sends to workers)
    assert settings.advertise_url == "http://127.0.0.1:8101" and settings.token == "internal"
    assert settings.labels == {"zone": "a", "pool": "big"}
    assert settings.broker_transport_options["data_folder_in"] == str(tmp_path / "broker" / "queue")
    with pytest.raises(ValueError, match="TESSERA_WORKER_ID"):
        AgentSettings.from_env(config, env={"TESSERA_CONTROL_PLANE_URL": "http://cp", "TESSERA_WORKER_ID": "a/b"})
    with pytest.raises(ValueError, match="key=value"):
        parse_labels("zone")


def test_the_worker_refuses_adapters_outside_its_own_root(agent, tmp_path):
    """Defence in depth: whatever the control plane sent, nothing outside <adapter root>/<tenant>/ loads."""
    root = tmp_path / "root"
    (root / "acme" / "sql").mkdir(parents=True)
    (root / "other" / "x").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "acme" / "escape").symlink_to(tmp_path / "elsewhere")
    (root / "acme" / "neighbour").symlink_to(root / "other" / "x")
    agent.control.specs[1] = spec()
    agent.runner.load_model(1, 1)
    base = {"attempt": 1, "status": "loading", "adapter": "acme:sql", "rank": 8, "replica_uid": "uid-1",
            "tenant": "acme"}
    sources = [str(tmp_path / "elsewhere"), str(root / "other" / "x"), str(root / "acme" / ".." / "other" / "x"),
               str(root / "acme" / "escape"), str(root / "acme" / "neighbour"), "../other/x", str(root / "acme"),
               "s3://bucket/../../../etc"]
    for pid, source in enumerate(sources, start=10):
        agent.control.placements[pid] = {**base, "id": pid, "source": source}
        assert agent.runner.load_adapter(pid, 1) == "failed", source
        body = agent.control.reports[-1][1]
        assert body["status"] == "failed" and body["permanent"] is True and body["kind"] == "not_found", source
    assert agent.built[0].adapters == {}  # the engine was never asked
    agent.slot.adapter_root = ""  # no root configured: no local adapters at all
    agent.control.placements[30] = {**base, "id": 30, "source": str(root / "acme" / "sql")}
    assert agent.runner.load_adapter(30, 1) == "failed" and "no adapter root" in agent.control.reports[-1][1]["reason"]
    agent.slot.adapter_root = str(root)
    assert agent.runner.load_adapter(30, 1) == "loaded"
    assert agent.built[0].adapters == {"acme:sql": str(root / "acme" / "sql")}


@pytest.mark.parametrize("engine_args,dense_above", [({}, 8), ({"int4_dense_above": 0}, None)])
def test_a_gguf_replica_keeps_the_files_blocks_with_a_dense_copy_for_big_batches(engine_args, dense_above):
    # The real build (no fake engine): quantization="gguf" runs decode steps of up to 8 rows as one
    # fused C++ call and larger ones on a dense copy, unless the deployment's engine_args say otherwise.
    from dataplane.quant.gguf import GgufLinear

    state = WorkerState(WorkerConfig(model="unassigned", kv_cache_memory="64MiB"))
    slot = EngineSlot(state, unload_grace_seconds=0.1)
    engine = slot._build("smollm2-135m-instruct", {**spec(quantization="gguf"), "engine_args": engine_args})
    try:
        model = engine.core.model
        assert isinstance(model.layers[0].qkv_proj, GgufLinear) and model.layers[0].qkv_proj.dense_above == \
            (dense_above or 0)
        assert model.fused is not None and model.fused.max_rows == dense_above
    finally:
        engine.shutdown()
