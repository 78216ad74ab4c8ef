"""The agent's settings, from the environment (the worker's own flags stay in dataplane/worker/config.py).

| variable | default | meaning |
|---|---|---|
| TESSERA_CONTROL_PLANE_URL | (unset: no agent) | base URL of the control plane, e.g. http://cp:8000 |
| TESSERA_WORKER_ID | `<hostname>-<port>` | the worker's name; it consumes the Celery queue `worker.<id>` |
| TESSERA_WORKER_ADVERTISE_URL | `http://<host>:<port>` | where the gateway reaches this worker |
| TESSERA_BROKER_URL, else CELERY_BROKER_URL | `filesystem://` | the Celery broker (Redis or RabbitMQ in production) |
| TESSERA_BROKER_FOLDER | `$TESSERA_VAR_DIR/broker` or `./var/broker` | the file-system broker's folders (one machine only) |
| TESSERA_INTERNAL_TOKEN | empty | sent to the control plane's internal API (its own secret: not the worker's --token) |
| TESSERA_WORKER_ADAPTER_ROOT | empty: no local adapters | the worker's `--adapter-root`: adapters load only from `<root>/<tenant>/` |
| TESSERA_HEARTBEAT_SECONDS | 2 | heartbeat interval (the control plane's answer may change it) |
| TESSERA_WORKER_ACCELERATOR | CUDA device name, or `cpu` | reported for placement constraints |
| TESSERA_WORKER_MEMORY_BYTES | accelerator memory, or physical RAM | reported for placement constraints |
| TESSERA_WORKER_DEVICES | CUDA device count, or 1 | devices a replica may span: a deployment with `tensor_parallel_size` N is placed only where N fit (on a CPU, the ranks to offer) |
| TESSERA_WORKER_LABELS | empty | `key=value,key=value`, matched by placement `labels` |
| TESSERA_UNLOAD_GRACE_SECONDS | 30 | in-flight requests get this long to finish before an unload |
| TESSERA_MODEL_CACHE | `~/.cache/tessera/models` | where object-store sources (s3://bucket/key) are looked up |
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dataplane.worker.config import WorkerConfig


@dataclass(slots=True)
class AgentSettings:
    control_plane_url: str
    worker_id: str
    advertise_url: str
    broker_url: str = "filesystem://"
    broker_transport_options: dict = field(default_factory=dict)
    token: str = ""
    heartbeat_seconds: float = 2.0
    accelerator: str = "cpu"
    memory_bytes: int | None = None
    device_count: int = 1  # devices a replica may span (tensor-parallel ranks)
    labels: dict[str, str] = field(default_factory=dict)
    unload_grace_seconds: float = 30.0
    model_cache: Path = field(default_factory=lambda: Path("~/.cache/tessera/models").expanduser())
    adapter_root: str = ""  # the worker's --adapter-root: tenant T's adapters load only from <root>/<T>/

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.worker_id):
            raise ValueError(f"TESSERA_WORKER_ID: {self.worker_id!r} may hold only letters, digits, '.', '-', '_'")
        if self.device_count < 1:
            raise ValueError(f"TESSERA_WORKER_DEVICES: must be >= 1, got {self.device_count}")
        if self.heartbeat_seconds <= 0:
            raise ValueError("TESSERA_HEARTBEAT_SECONDS: must be > 0")
        self.control_plane_url = self.control_plane_url.rstrip("/")

    @property
    def queue(self) -> str:
        return f"worker.{self.worker_id}"

    @classmethod
    def from_env(cls, config: WorkerConfig, env: Mapping[str, str] | None = None) -> AgentSettings | None:
        """None when TESSERA_CONTROL_PLANE_URL is unset (a standalone worker)."""
        env = os.environ if env is None else env
        url = env.get("TESSERA_CONTROL_PLANE_URL", "").strip()
        if not url:
            return None
        host = config.host if config.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        worker_id = env.get("TESSERA_WORKER_ID") or re.sub(r"[^A-Za-z0-9._-]", "-", f"{socket.gethostname()}-{config.port}")
        broker = env.get("TESSERA_BROKER_URL") or env.get("CELERY_BROKER_URL") or "filesystem://"
        accelerator, memory = detect_accelerator()
        raw_memory = env.get("TESSERA_WORKER_MEMORY_BYTES")
        return cls(
            control_plane_url=url, worker_id=worker_id,
            advertise_url=env.get("TESSERA_WORKER_ADVERTISE_URL") or f"http://{host}:{config.port}",
            broker_url=broker, broker_transport_options=broker_options(broker, env),
            token=env.get("TESSERA_INTERNAL_TOKEN", ""), adapter_root=config.adapter_root,
            heartbeat_seconds=float(env.get("TESSERA_HEARTBEAT_SECONDS", "2")),
            accelerator=env.get("TESSERA_WORKER_ACCELERATOR") or accelerator,
            memory_bytes=int(raw_memory) if raw_memory else memory,
            device_count=int(env.get("TESSERA_WORKER_DEVICES") or detect_device_count()),
            labels=parse_labels(env.get("TESSERA_WORKER_LABELS", "")),
            unload_grace_seconds=float(env.get("TESSERA_UNLOAD_GRACE_SECONDS", "30")),
            model_cache=Path(env.get("TESSERA_MODEL_CACHE", "~/.cache/tessera/models")).expanduser(),
        )


def broker_options(broker_url: str, env: Mapping[str, str]) -> dict:
    """The file-system transport's folders: the same layout as controlplane/settings/base.py."""
    if not broker_url.startswith("filesystem://"):
        return {}
    var = Path(env.get("TESSERA_VAR_DIR") or Path.cwd() / "var")
    folder = Path(env.get("TESSERA_BROKER_FOLDER") or var / "broker")
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {"data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"), "control_folder": str(folder / "control")}


def parse_labels(raw: str) -> dict[str, str]:
    labels = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"TESSERA_WORKER_LABELS: {item!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


def detect_device_count() -> int:
    """GPUs this process sees; a CPU worker offers one unless TESSERA_WORKER_DEVICES says more."""
    try:
        import torch  # lazy: heavy; the agent's settings are read (and tested) without the engine

        return max(1, torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - no CUDA build
        return 1


def detect_accelerator() -> tuple[str, int | None]:
    try:
        import torch  # lazy: as above

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return props.name, int(props.total_memory)
    except Exception:  # noqa: BLE001 - no CUDA: a CPU worker
        pass
    try:
        return "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "cpu", None
