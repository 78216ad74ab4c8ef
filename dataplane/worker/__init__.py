"""The data-plane worker: one engine behind an OpenAI-compatible HTTP API (`python -m dataplane.worker`)."""
