"""The internal API workers call: registration, heartbeats, specs of their work, status reports.

Guarded by the shared worker token (TESSERA_WORKER_TOKEN, the same secret the gateway sends to
workers). With no token configured only loopback callers are accepted (a one-machine stack).
"""
