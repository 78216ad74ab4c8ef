"""The control plane's internal API, as the agent calls it (sync httpx; the agent runs in threads)."""

from __future__ import annotations

from typing import Any

import httpx


class ControlPlaneUnavailable(Exception):
    """Network trouble or a 5xx: worth retrying later."""


class ControlPlaneRejected(Exception):
    """A 4xx other than the ones below: retrying the same call will not help."""


class NotRegistered(ControlPlaneRejected):
    """404/409 on a worker route: the control plane does not know this worker (or this boot)."""


class Gone(ControlPlaneRejected):
    """The replica or placement no longer exists or is no longer this worker's."""


class ControlPlaneClient:
    def __init__(self, base_url: str, worker_id: str, token: str = "", timeout: float = 10.0,
                 boot_id: str = "") -> None:
        self.worker_id = worker_id
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if boot_id:  # the registration is bound to it: routes about this worker's work require it
            headers["X-Tessera-Boot-Id"] = boot_id
        self.http = httpx.Client(base_url=f"{base_url.rstrip('/')}/internal/v1", headers=headers, timeout=timeout,
                                 trust_env=False)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, body: dict | None = None, missing: type[Exception] = Gone) -> Any:
        try:
            response = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ControlPlaneUnavailable(f"{method} {path}: {exc!r}") from exc
        if response.status_code >= 500:
            raise ControlPlaneUnavailable(f"{method} {path}: HTTP {response.status_code}")
        if response.status_code in (404, 409):
            raise missing(f"{method} {path}: HTTP {response.status_code} {response.text[:200]}")
        if response.status_code >= 400:
            raise ControlPlaneRejected(f"{method} {path}: HTTP {response.status_code} {response.text[:500]}")
        return response.json()

    def register(self, body: dict) -> dict:
        return self._call("POST", "/workers/register", {"name": self.worker_id, **body})

    def heartbeat(self, body: dict) -> dict:
        return self._call("POST", f"/workers/{self.worker_id}/heartbeat", body, missing=NotRegistered)

    def release(self) -> dict:
        """Give this worker's name up on a clean stop (its next boot then registers at once)."""
        return self._call("POST", f"/workers/{self.worker_id}/release", {}, missing=NotRegistered)

    def drain(self) -> dict:
        """Cordon this worker -> {"cordoned": True, "waiting_for": replicas not yet replaced elsewhere}."""
        return self._call("POST", f"/workers/{self.worker_id}/drain", {}, missing=NotRegistered)

    def replica(self, replica_id: int) -> dict:
        return self._call("GET", f"/workers/{self.worker_id}/replicas/{replica_id}")

    def report_replica(self, replica_id: int, body: dict) -> dict:
        return self._call("POST", f"/workers/{self.worker_id}/replicas/{replica_id}/status", body)

    def placement(self, placement_id: int) -> dict:
        return self._call("GET", f"/workers/{self.worker_id}/adapters/{placement_id}")

    def report_placement(self, placement_id: int, body: dict) -> dict:
        return self._call("POST", f"/workers/{self.worker_id}/adapters/{placement_id}/status", body)
