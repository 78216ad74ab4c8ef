"""Reading an OpenAI request body just enough to route, limit and meter it.

Every field the gateway reads is type-checked here, and a wrong one is a 400 in OpenAI's shape
naming the field (`messages[2].content[0].text`), never a 500. Fields the gateway does not read
pass through untouched: the worker validates the whole body (dataplane/worker/protocol.py).

The body is forwarded as sent (re-encoded only when streaming, to ask the worker for usage).
The gateway has no tokenizer: the prompt is estimated from the UTF-8 size of everything the
worker renders, erring high (3 bytes per token): message contents, roles, names, tool-call ids,
assistant `tool_calls` and `tools` (as JSON), + 8 tokens per message and, per chat request, the
chat template's own overhead (TESSERA_CHAT_TEMPLATE_TOKENS: default system prompt, markers).
The reservation is that estimate + max_tokens × n; settle corrects it to what was served.

3 bytes per token errs high for English prose (~4.4 on SmolLM2) but not for code (~2.2), JSON
(~1.8), CJK text (~1.4) or digits (1.0). That is fine for rate limits, which settle charges the
difference, but not for a hard budget, where the reservation is also the worker's allowance
(`X-Token-Allowance`: it refuses or truncates what does not fit). So `prompt_bound` is a true upper
bound as well: one token per UTF-8 byte (a byte-level BPE or byte-fallback tokenizer never makes
more tokens than bytes), plus the same per-message and template overheads; the gateway reserves
with it for tenants under a hard budget (proxy.reserve).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings

from common.errors import ApplicationError

BYTES_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 8
AFFINITY_CHARS = 2048  # how much of a completions prompt identifies its prefix
MAX_N = 128  # OpenAI's limit on choices per request
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request (a worker may take fewer)
MAX_TOKENS_LIMIT = 2**31 - 1  # int32, as OpenAI's API; keeps every reservation within a bigint


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    kind: str  # "chat" | "completions" | "embeddings"
    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # client asked for stream_options.include_usage
    prompt_estimate: int  # tokens, estimated (3 bytes a token)
    prompt_bound: int  # tokens, at most (1 byte a token): what a hard budget reserves
    max_completion: int  # per choice: max_tokens, or the default reservation when omitted
    n: int
    prefix: bytes  # what identifies a shared prefix (system prompt / first message)

    @property
    def reserve_tokens(self) -> int:
        return self.prompt_estimate + self.max_completion * self.n

    @property
    def bound_tokens(self) -> int:
        return self.prompt_bound + self.max_completion * self.n


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> ApplicationError:
    return ApplicationError(message, code=code, status=400, param=param)


def type_error(param: str, expected: str) -> ApplicationError:
    return invalid(f"Invalid type for '{param}': expected {expected}.", param, "invalid_type")


def content_parts(content: Any, param: str, expected: str) -> Iterator[tuple[str, dict]]:
    """(where, part) for each object of an array of content parts; `expected` names what else `param` may be.

    Chat messages and Responses input items share this; each then reads the parts it accepts.
    """
    if not isinstance(content, list):
        raise type_error(param, expected)
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise type_error(where, "a content part object")
        yield where, part


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(body: dict, name: str, limit: int = MAX_TOKENS_LIMIT) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise type_error(name, "an integer")
    if not 1 <= value <= limit:
        raise invalid(f"Invalid value for '{name}': expected an integer from 1 to {limit}, got {value}.", name,
                      "invalid_value")
    return value


def _optional(body: dict, name: str, kind: type, expected: str, param: str | None = None) -> Any:
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        raise type_error(param or name, expected)
    return value


def estimate_tokens(text: str | bytes) -> int:
    return -(-_size(text) // BYTES_PER_TOKEN)


def _size(text: str | bytes) -> int:
    # A str from orjson is always encodable (it refuses lone surrogates), but be safe: count them too.
    return len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)


def _json_size(value: Any) -> int:
    """What a template renders of a JSON value; +1 byte per separator for the spaces json.dumps adds."""
    raw = orjson.dumps(value)
    return len(raw) + raw.count(b",") + raw.count(b":")


def _content(content: Any, param: str) -> str:
    """A message's text: a string, null, or an array of content parts whose text is a string."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for where, part in content_parts(content, param, "a string, null or an array of content parts"):
        kind = part.get("type")
        if not isinstance(kind, str):
            raise type_error(f"{where}.type", "a string")
        text = part.get("text")
        if kind == "text" and not isinstance(text, str):
            raise type_error(f"{where}.text", "a string")
        if text is not None and not isinstance(text, str):
            raise type_error(f"{where}.text", "a string")
        texts.append(text or "")
    return "".join(texts)


def _message_bytes(i: int, message: Any) -> tuple[str, str, int]:
    """(role, text, bytes the template renders) of messages[i], type-checking what the gateway reads."""
    param = f"messages[{i}]"
    if not isinstance(message, dict):
        raise type_error(param, "a message object")
    role = message.get("role")
    if role is None:
        raise invalid(f"Missing required parameter: '{param}.role'.", f"{param}.role", "missing_required_parameter")
    if not isinstance(role, str):
        raise type_error(f"{param}.role", "a string")
    text = _content(message.get("content"), f"{param}.content")
    size = _size(role) + _size(text)
    for field in ("name", "tool_call_id"):
        value = _optional(message, field, str, "a string", f"{param}.{field}")
        size += _size(value or "")
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise type_error(f"{param}.tool_calls", "an array of tool call objects")
        size += _json_size(calls)
    return role, text, size


def _chat(body: dict) -> tuple[int, int, bytes, int | None]:
    messages = body.get("messages")
    if messages is None:
        raise invalid("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise type_error("messages", "an array of message objects")
    if not messages:
        raise invalid("'messages' must contain at least one message.", "messages", "invalid_value")
    size = 0
    first_role = first_text = ""
    for i, message in enumerate(messages):
        role, text, message_size = _message_bytes(i, message)
        if i == 0:
            first_role, first_text = role, text
        size += message_size
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise type_error("tools", "an array of tool objects")
        size += _json_size(tools)
    overhead = TOKENS_PER_MESSAGE * len(messages) + settings.TESSERA_CHAT_TEMPLATE_TOKENS
    estimate, bound = -(-size // BYTES_PER_TOKEN) + overhead, size + overhead
    prefix = f"{first_role}\x00{first_text}".encode("utf-8", "surrogatepass")
    max_completion = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    return estimate, bound, prefix, max_completion


def _completions(body: dict, field: str = "prompt") -> tuple[int, int, bytes, int]:
    """(estimate, bound, prefix, prompts): a string, strings, token ids or arrays of token ids, as the
    worker takes (completions' `prompt`, embeddings' `input`). The bound allows one special token (BOS)
    per text prompt; token ids are exact."""
    prompt = body.get(field)
    if isinstance(prompt, str):
        return estimate_tokens(prompt), _size(prompt) + 1, prompt[:AFFINITY_CHARS].encode("utf-8", "surrogatepass"), 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return (sum(estimate_tokens(p) for p in prompt), sum(_size(p) + 1 for p in prompt),
                    prompt[0][:AFFINITY_CHARS].encode("utf-8", "surrogatepass"), len(prompt))
        if all(_is_int(p) for p in prompt):  # token ids: count them, not their digits
            return len(prompt), len(prompt), ",".join(map(str, prompt[:AFFINITY_CHARS])).encode(), 1
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            exact = sum(map(len, prompt))
            return exact, exact, ",".join(map(str, prompt[0][:AFFINITY_CHARS])).encode(), len(prompt)
    if prompt is None:
        raise invalid(f"Missing required parameter: '{field}'.", field, "missing_required_parameter")
    raise invalid(f"'{field}' must be a string, an array of strings, an array of token ids or an array of "
                  "token-id arrays, and not empty.", field, "invalid_type")


def json_object(raw: bytes) -> dict:
    """A request body that must be a JSON object, or the 400 OpenAI answers for anything else."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise invalid("We could not parse the JSON body of your request.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", code="invalid_json")
    return body


def parse(raw: bytes, kind: str) -> ParsedRequest:
    body = json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("you must provide a model parameter", "model", "missing_required_parameter")
    stream = bool(_optional(body, "stream", bool, "a boolean"))
    options = _optional(body, "stream_options", dict, "an object or null") or {}
    wants_usage = bool(_optional(options, "include_usage", bool, "a boolean", "stream_options.include_usage"))
    n = _positive_int(body, "n", MAX_N) or 1

    if kind == "chat":
        prompt_estimate, prompt_bound, prefix, max_completion = _chat(body)
    elif kind == "embeddings":  # input tokens only: nothing is generated, nothing streams
        prompt_estimate, prompt_bound, prefix, n = _completions(body, "input")
        if n > MAX_EMBEDDING_INPUTS:
            raise invalid(f"'input' may hold at most {MAX_EMBEDDING_INPUTS} inputs, got {n}.", "input",
                          "too_many_inputs")
        stream, wants_usage, max_completion = False, False, 0
    else:
        prompt_estimate, prompt_bound, prefix, prompts = _completions(body)
        n *= prompts
        max_completion = _completion_max_tokens(body)
    if max_completion is None:
        max_completion = settings.TESSERA_DEFAULT_MAX_TOKENS
    return ParsedRequest(kind, body, model, stream, wants_usage, prompt_estimate, prompt_bound, max_completion, n,
                         prefix)


def _completion_max_tokens(body: dict) -> int | None:
    """max_tokens 0 scores a prompt (its logprobs, with echo or prompt_logprobs): the worker generates nothing."""
    if body.get("max_tokens") == 0 and _is_int(body["max_tokens"]) and (
            body.get("echo") is True or body.get("prompt_logprobs") is not None):
        return 0
    return _positive_int(body, "max_tokens")


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
