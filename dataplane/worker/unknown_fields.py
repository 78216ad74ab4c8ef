"""Fields the worker does not implement: refused by name, or ignored only where that cannot change
the answer the client expects.

A client that sends a field expects it to do something; silently dropping one (as pydantic's
`extra="ignore"` would) hands back an answer the client believes was shaped by it. So a top-level
field the request models do not know is a 400 `unsupported_parameter` naming it, except for the
few below, which only label, route or bill a request at OpenAI and leave its tokens unchanged.
"""

from __future__ import annotations

from typing import Any

from dataplane.worker.errors import invalid

# OpenAI fields that never change the generated tokens: labels and storage (the gateway keeps what
# it stores), the caching and safety hints, latency-only hints, and reasoning effort (no reasoning
# model is served: there is nothing for it to shorten or lengthen).
IGNORED = frozenset({
    "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
    "prediction", "reasoning_effort",
})

RESPONSE_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type", "schema"}, "json_schema": {"type", "json_schema"}}
JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


def refuse_unknown(extra: dict[str, Any] | None) -> None:
    """A 400 naming the first field (alphabetically) that is neither implemented nor harmless."""
    if not extra:
        return
    modalities = extra.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise invalid(f"modalities: only ['text'] is supported, got {modalities!r}", "modalities",
                      "unsupported_parameter")
    unknown = sorted(k for k in extra if k not in IGNORED and k != "modalities")
    if unknown:
        raise invalid(f"{unknown[0]}: this parameter is not supported by this worker"
                      + (f" (nor {', '.join(unknown[1:])})" if unknown[1:] else ""), unknown[0],
                      "unsupported_parameter")


def response_format_schema(fmt: dict[str, Any]) -> dict[str, Any] | None:
    """`{"type": "json_object", "schema": {...}}`: the schema to constrain to, or None (any JSON object)."""
    schema = fmt.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise invalid("response_format.schema: must be a JSON schema object", "response_format.schema")
    return schema


def check_response_format_keys(fmt: dict[str, Any]) -> None:
    """A key response_format's type does not take (say `json_schema` under json_object) is refused, not dropped."""
    allowed = RESPONSE_FORMAT_KEYS.get(fmt.get("type") or "text")
    if allowed is None:
        return  # the type itself is refused, naming response_format.type
    extra = sorted(set(fmt) - allowed)
    if extra:
        raise invalid(f"response_format.{extra[0]}: not taken with type {fmt.get('type')!r}",
                      f"response_format.{extra[0]}", "unsupported_parameter")
    inner = fmt.get("json_schema")
    if isinstance(inner, dict):
        extra = sorted(set(inner) - JSON_SCHEMA_KEYS)
        if extra:
            raise invalid(f"response_format.json_schema.{extra[0]}: not a json_schema field",
                          f"response_format.json_schema.{extra[0]}", "unsupported_parameter")
