"""The internal API workers call: registration, heartbeats, specs of their work, status reports.

Guarded by its own token, TESSERA_INTERNAL_TOKEN: not the token the gateway sends to workers
(TESSERA_WORKER_TOKEN), not an API key, not an admin session, so no secret a tenant-facing or
operator-facing component holds opens it. With no token configured only loopback callers are
accepted (a one-machine stack). Which worker a caller is comes on top of that: a registration is
bound to the worker's boot id (services/workers.py), and the routes under workers/<name>/ that
read or change its work require that boot id (header X-Tessera-Boot-Id).
"""
