"""The gateway's side of scale to zero: a request for a deployment at zero wakes it and is refused.

**Choice: refuse with 503 + Retry-After, do not hold the request.** A cold start is a model load:
seconds for SmolLM2 on a CPU worker, minutes for a large model on a GPU, and longer when the
cluster autoscaler must first add a node (deploy/k8s/autoscaling.yaml). Holding the request that
long keeps a gateway connection and a limiter reservation open, and outlasts most clients' and
proxies' read timeouts, which then retry anyway, blind. A 503 with `Retry-After` says what is
happening and when to come back; the OpenAI SDKs retry a 503 by themselves and honour the header.
The refusal is decided after authentication and authorization (an adapter of another tenant is
still a 404, a key not allowed the model still a 403) and before any limiter reservation, so it
costs the tenant nothing and is not billed.

The wake itself (service.autoscale_wake) is idempotent: every gateway process that sees a request
may call it; the first raises desired replicas to max(1, min_replicas), the rest find it above zero.
Each process calls it at most once a second per deployment.
"""

from __future__ import annotations

import logging
import time

from common.asyncdb import db_call
from common.errors import ApplicationError

from .. import conf
from .service import autoscale_wake

log = logging.getLogger("tessera.gateway")

WAKE_EVERY_SECONDS = 1.0


class Waker:
    def __init__(self) -> None:
        self._last: dict[int, float] = {}  # deployment id -> monotonic time of this process's last wake call

    async def refuse(self, *, name: str, deployment_id: int) -> None:
        """Wake the deployment (at most once a second from this process), then raise the 503."""
        now = time.monotonic()
        if now - self._last.get(deployment_id, -WAKE_EVERY_SECONDS) >= WAKE_EVERY_SECONDS:
            self._last[deployment_id] = now
            try:
                await db_call(autoscale_wake, deployment_id=deployment_id)
            except Exception as exc:  # noqa: BLE001 - the refusal stands; the next request tries again
                log.warning("cold start: could not wake the deployment",
                            extra={"deployment_id": deployment_id, "error": repr(exc)})
                self._last.pop(deployment_id, None)
        retry = max(1, int(conf.get("TESSERA_AUTOSCALE_COLD_START_RETRY_SECONDS")))
        raise ApplicationError(
            f"The model `{name}` is scaled to zero and is starting now. Please retry in {retry} s.",
            code="model_cold_start", status=503, headers={"Retry-After": str(retry)})
