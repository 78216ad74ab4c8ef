"""Reading an OpenAI request body just enough to route, limit and meter it.

The body is forwarded as sent (re-encoded only when streaming, to ask the worker for usage).
The gateway has no tokenizer: the prompt is estimated from its UTF-8 size, erring high
(3 bytes per token, + 8 per message), so a reservation rarely falls short; settle corrects it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings

from controlplane.errors import ApplicationError

BYTES_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 8
AFFINITY_CHARS = 2048  # how much of a completions prompt identifies its prefix


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    kind: str  # "chat" | "completions"
    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # client asked for stream_options.include_usage
    prompt_estimate: int  # tokens, estimated
    max_completion: int  # per choice: max_tokens, or the default reservation when omitted
    n: int
    prefix: bytes  # what identifies a shared prefix (system prompt / first message)

    @property
    def reserve_tokens(self) -> int:
        return self.prompt_estimate + self.max_completion * self.n


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> ApplicationError:
    return ApplicationError(message, code=code, status=400, param=param)


def _positive_int(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(f"'{name}' must be a positive integer.", name, "invalid_value")
    return value


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def estimate_tokens(text: str | bytes) -> int:
    size = len(text.encode() if isinstance(text, str) else text)
    return -(-size // BYTES_PER_TOKEN)


def parse(raw: bytes, kind: str) -> ParsedRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid("We could not parse the JSON body of your request.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("you must provide a model parameter", "model", "missing_required_parameter")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean.", "stream", "invalid_type")
    options = body.get("stream_options") or {}
    wants_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    n = _positive_int(body, "n") or 1

    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise invalid("'messages' must be a non-empty array of message objects.", "messages")
        texts = [_text_of(m.get("content")) for m in messages]
        prompt_estimate = sum(estimate_tokens(t) + TOKENS_PER_MESSAGE for t in texts)
        prefix = f"{messages[0].get('role', '')}\x00{texts[0]}".encode()
        max_completion = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_text = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompt_text = prompt[0]
            n *= len(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            prompt_text = ",".join(map(str, prompt))  # token ids: count them, not their digits
        else:
            raise invalid("'prompt' must be a string, an array of strings or an array of token ids.", "prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            prompt_estimate = len(prompt)
        elif isinstance(prompt, list):
            prompt_estimate = sum(estimate_tokens(p) for p in prompt)
        else:
            prompt_estimate = estimate_tokens(prompt_text)
        prefix = prompt_text[:AFFINITY_CHARS].encode()
        max_completion = _positive_int(body, "max_tokens")
    if max_completion is None:
        max_completion = settings.TESSERA_DEFAULT_MAX_TOKENS
    return ParsedRequest(kind, body, model, stream, wants_usage, prompt_estimate, max_completion, n, prefix)


def affinity_key(parsed: ParsedRequest, cache_salt: str) -> bytes:
    """Stable across gateway processes (not Python's randomised hash); salted per tenant because
    workers salt their prefix cache per tenant, so two tenants' prefixes never share blocks."""
    return hashlib.blake2b(cache_salt.encode() + b"\x00" + parsed.prefix, digest_size=16).digest()


def upstream_body(raw: bytes, parsed: ParsedRequest) -> bytes:
    """Streaming: always ask the worker for the final usage chunk (stripped again if the client
    did not ask for it). Otherwise the client's bytes go through untouched."""
    if not parsed.stream or parsed.wants_usage:
        return raw
    body = dict(parsed.body)
    options = dict(body.get("stream_options") or {})
    options["include_usage"] = True
    body["stream_options"] = options
    return orjson.dumps(body)
