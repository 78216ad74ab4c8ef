"""Counters of the doors on the control plane's /metrics, and the log lines that go with them.

Per process, like the gateway's counters: sum over processes in Prometheus. Each failed or refused
sign-in is also one `tessera.doors` log line (username, client address, door) for the audit trail.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from controlplane.slo.metrics import REGISTRY

log = logging.getLogger("tessera.doors")

LOGIN_FAILURES = Counter("tessera_login_failures", "Failed sign-ins (wrong password, unknown user, refused while "
                         "locked out), by door (admin, api, other)", ["door"], registry=REGISTRY)
LOCKOUTS = Counter("tessera_login_lockouts", "Sign-in attempts answered with a lockout (the failure that reached "
                   "the limit, and every attempt refused while locked)", ["door"], registry=REGISTRY)
SECOND_FACTOR_FAILURES = Counter("tessera_login_second_factor_failures", "Wrong or refused TOTP / recovery codes",
                                 registry=REGISTRY)


def door(request) -> str:
    path = getattr(request, "path", "") or ""
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith("/api/"):
        return "api"
    return "other"


def _who(request, username) -> dict:
    return {"username": username, "client_ip": getattr(request, "axes_ip_address", None), "door": door(request)}


def on_login_failed(sender, credentials=None, request=None, **kwargs) -> None:
    username = (credentials or {}).get("username")
    LOGIN_FAILURES.labels(door(request)).inc()
    log.info("sign-in failed", extra={"event": "login_failed", **_who(request, username)})


def on_locked_out(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    LOCKOUTS.labels(door(request)).inc()
    log.warning("sign-in locked out", extra={"event": "login_locked_out", **_who(request, username),
                                             "client_ip": ip_address})


def on_second_factor_failed(*, request, username: str, reason: str) -> None:
    SECOND_FACTOR_FAILURES.inc()
    log.warning("second factor refused", extra={"event": "second_factor_failed", "reason": reason,
                                                **_who(request, username)})
