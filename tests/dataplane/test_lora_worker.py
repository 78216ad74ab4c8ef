"""The worker's adapter routes, `model` naming an adapter, and LoRA metrics, against a scripted engine."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import pytest

from dataplane.lora.manager import AdapterInfo, LoRAStats
from dataplane.worker.config import WorkerConfig, load_config
from dataplane.worker.routes import WorkerState, create_app
from tests.dataplane.worker.fakes import FakeEngine


@dataclass
class FakeLoRAEngine(FakeEngine):
    adapters: dict[str, str] = field(default_factory=dict)
    in_use: set[str] = field(default_factory=set)
    used: list[str | None] = field(default_factory=list)  # adapter of each generate call

    def __post_init__(self) -> None:
        super().__post_init__()
        self.latest_lora_stats = LoRAStats(max_loras=2)

    def _refresh(self) -> None:
        self.latest_lora_stats = LoRAStats(2, sorted(self.adapters), {n: 1 for n in self.in_use}, {}, 3, 1)

    async def add_adapter(self, name: str, path: str) -> None:
        if "bad" in path:
            raise ValueError(f"adapter {name!r}: adapter_config.json is missing from {path}")
        self.adapters[name] = path
        self._refresh()

    async def remove_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise ValueError(f"adapter: unknown adapter {name!r} (loaded: none)")
        if name in self.in_use:
            raise ValueError(f"adapter: {name!r} is in use by running or waiting requests")
        del self.adapters[name]
        self._refresh()

    async def list_adapters(self) -> list[AdapterInfo]:
        return [AdapterInfo(n, p, 8, ["q_proj"], {"q_proj": 2.0}, 1024, False) for n, p in self.adapters.items()]

    def generate(self, prompt, params, *, adapter=None, **kw):  # noqa: ANN001, ANN201
        self.used.append(adapter)
        return super().generate(prompt, params, adapter=adapter, **kw)


def make(engine: FakeEngine | None = None, token: str = "") -> tuple[FakeEngine, httpx.AsyncClient]:
    engine = engine or FakeLoRAEngine()
    state = WorkerState(WorkerConfig(model="fake", token=token), engine)
    return engine, httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w")


async def test_load_list_use_and_unload_an_adapter():
    engine, client = make()
    r = await client.post("/v1/adapters", json={"name": "tenant-a", "path": "/adapters/a"})
    assert r.status_code == 200 and r.json()["id"] == "tenant-a" and r.json()["rank"] == 8
    assert [a["id"] for a in (await client.get("/v1/adapters")).json()["data"]] == ["tenant-a"]
    models = (await client.get("/v1/models")).json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [("fake", None), ("tenant-a", "fake")]

    r = await client.post("/v1/completions", json={"model": "tenant-a", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "tenant-a"
    r = await client.post("/v1/chat/completions", json={"model": "fake", "max_tokens": 2,
                                                        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["model"] == "fake"
    assert engine.used == ["tenant-a", None]

    r = await client.delete("/v1/adapters/tenant-a")
    assert r.status_code == 200 and r.json() == {"id": "tenant-a", "object": "adapter", "deleted": True}
    r = await client.post("/v1/completions", json={"model": "tenant-a", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_adapter_errors():
    engine, client = make()
    r = await client.post("/v1/adapters", json={"name": "x", "path": "/bad/place"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_adapter"
    assert "adapter_config.json is missing" in r.json()["error"]["message"]
    r = await client.post("/v1/adapters", content=b"{nope")
    assert r.status_code == 400
    r = await client.post("/v1/adapters", json={"name": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "name"
    r = await client.delete("/v1/adapters/ghost")
    assert r.status_code == 404 and r.json()["error"]["code"] == "adapter_not_found"
    await client.post("/v1/adapters", json={"name": "busy", "path": "/adapters/b"})
    engine.in_use.add("busy")
    r = await client.delete("/v1/adapters/busy")
    assert r.status_code == 409 and r.json()["error"]["code"] == "adapter_in_use"
    r = await client.post("/v1/completions", json={"model": "other", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


async def test_lora_disabled_and_auth():
    _, client = make(FakeEngine())  # no latest_lora_stats: LoRA is off
    r = await client.post("/v1/adapters", json={"name": "x", "path": "/p"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_disabled"
    assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["fake"]
    _, client = make(token="s3cret")
    r = await client.post("/v1/adapters", json={"name": "x", "path": "/p"})
    assert r.status_code == 401
    r = await client.get("/v1/adapters", headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200


async def test_lora_metrics():
    engine, client = make()
    await client.post("/v1/adapters", json={"name": "a", "path": "/adapters/a"})
    await client.post("/v1/adapters", json={"name": "b", "path": "/adapters/b"})
    engine.in_use.add("a")
    engine._refresh()
    text = (await client.get("/metrics")).text
    assert 'tessera:lora_adapters_loaded{model_name="fake"} 2.0' in text
    assert 'tessera:lora_requests_running{adapter="a",model_name="fake"} 1.0' in text
    assert 'tessera:lora_requests_waiting{adapter="b",model_name="fake"} 0.0' in text
    assert 'tessera:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""}' in text
    assert 'tessera:lora_slot_evictions_total{model_name="fake"} 1.0' in text


def test_worker_flags():
    cfg = load_config(["--model", "m", "--enable-lora", "--max-loras", "8", "--max-lora-rank", "32"],
                      env={"TESSERA_WORKER_MAX_CPU_LORAS": "64"})
    kw = cfg.engine_kwargs()
    assert (kw["enable_lora"], kw["max_loras"], kw["max_lora_rank"], kw["max_cpu_loras"]) == (True, 8, 32, 64)
    assert "enable_lora" not in load_config(["--model", "m"], env={}).engine_kwargs()
    with pytest.raises(ValueError, match="^max_lora_rank:"):
        load_config(["--model", "m", "--enable-lora", "--max-lora-rank", "128"], env={})


async def test_the_adapter_route_refuses_paths_outside_the_adapter_root(tmp_path):
    root = tmp_path / "root"
    (root / "acme" / "a").mkdir(parents=True)
    (root / "acme" / "out").symlink_to(tmp_path)
    engine = FakeLoRAEngine()
    state = WorkerState(WorkerConfig(model="fake", adapter_root=str(root)), engine)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w")
    for path in ("/etc", str(root / ".." / "x"), str(root / "acme" / "out"), "../x", str(root)):
        r = await client.post("/v1/adapters", json={"name": "x", "path": path})
        assert r.status_code == 400 and r.json()["error"]["code"] == "adapter_outside_root", path
    assert engine.adapters == {}
    r = await client.post("/v1/adapters", json={"name": "a", "path": "acme/a"})
    assert r.status_code == 200 and engine.adapters == {"a": str(root / "acme" / "a")}
    assert load_config(["--model", "m", "--adapter-root", str(root)]).adapter_root == str(root)
