"""Request bodies, after OpenAI's schemas, and what they mean for the engine.

Parsing is strict about the types of the fields it knows (`"temperature": "0.5"` is a 400, as it
is at OpenAI). A top-level field it does not know is refused with a 400 naming it, unless it is
one of OpenAI's that cannot change the answer (unknown_fields.py). Every field is nullable, so a
client that sends `"n": null` gets the default. Extensions (after vLLM's): top_k, min_p,
repetition_penalty, priority, ignore_eos, stop_token_ids, skip_special_tokens,
include_stop_str_in_output, prompt_logprobs, and for
structured outputs `structured_outputs` ({json | json_object | regex | choice | grammar}) and the
older guided_json, guided_regex, guided_choice, guided_grammar. OpenAI's `response_format`
(json_object, json_schema) is taken on both endpoints.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr

from dataplane.sampling_params import SamplingParams
from dataplane.spec_decode.config import MAX_DRAFT_TOKENS
from dataplane.structured.params import KINDS, StructuredOutputs
from dataplane.worker.errors import WorkerError, invalid
from dataplane.worker.tool_parsers import ToolParser
from dataplane.worker.tools import ToolMode, parse_tools, template_message
from dataplane.worker.unknown_fields import check_response_format_keys, refuse_unknown, response_format_schema


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _TopLevel(_Body):
    # Unknown top-level fields are kept, then refused or ignored by name (unknown_fields.py).
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Body):
    include_usage: bool | None = None


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool's answer to that call


class GenerationRequest(_TopLevel):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    # extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    priority: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and this many alternatives
    speculative: dict[str, Any] | None = None  # {"method": "ngram", "num_tokens": k}: prompt-lookup drafts
    # structured outputs
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """Engine parameters; a bad value raises ValueError naming the field (mapped to a 400)."""
        given = {
            "n": self.n, "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "top_k": self.top_k, "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
            "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "logit_bias": self._logit_bias(), "prompt_logprobs": self.engine_prompt_logprobs,
            "speculative_tokens": self._speculative_tokens(),
        }
        refuse_unknown(self.model_extra)
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, stop=stop, structured=self.structured(),
                              **{k: v for k, v in given.items() if v is not None})

    @property
    def engine_prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token the engine computes, or None (no prompt logprobs)."""
        if self.prompt_logprobs is not None and self.stream:
            # As vLLM: the prompt's logprobs are one block, not a stream of deltas.
            raise invalid("prompt_logprobs: not available when streaming; use stream: false",
                          "prompt_logprobs", "unsupported_parameter")
        return self.prompt_logprobs

    def _speculative_tokens(self) -> int | None:
        """Draft tokens per step this request asks for (0: none); None: the worker's default."""
        spec = self.speculative
        if spec is None:
            return None
        if set(spec) - {"method", "num_tokens"} or spec.get("method", "ngram") not in ("ngram", "prompt_lookup"):
            raise invalid('speculative: expected {"method": "ngram", "num_tokens": k}', "speculative")
        k = spec.get("num_tokens")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_DRAFT_TOKENS):
            raise invalid(f"speculative.num_tokens: must be an integer in [0, {MAX_DRAFT_TOKENS}], got {k!r}",
                          "speculative")
        return k

    def _logit_bias(self) -> dict[int, float] | None:
        """OpenAI sends token ids as JSON object keys (strings)."""
        if not self.logit_bias:
            return None
        out = {}
        for key, bias in self.logit_bias.items():
            if not (key.isascii() and key.isdigit()):
                raise invalid(f"logit_bias: {key!r} is not a token id", "logit_bias")
            out[int(key)] = bias
        return out

    def structured(self) -> StructuredOutputs | None:
        """The output constraint, from whichever one field carries it (a 400 if several do)."""
        legacy = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
        given = [f for f in ("response_format", "structured_outputs", *legacy) if getattr(self, f) is not None]
        if self.response_format is not None:
            check_response_format_keys(self.response_format)
        if self.response_format is not None and self.response_format.get("type") in (None, "text"):
            given.remove("response_format")  # plain text: no constraint
        if not given:
            return None
        if len(given) > 1:
            raise invalid(f"{given[1]}: only one of {', '.join(given)} may constrain the output", given[1])
        source = given[0]
        if source == "response_format":
            return _response_format(self.response_format)
        if source == "structured_outputs":
            unknown = sorted(set(self.structured_outputs) - set(KINDS))
            if unknown:
                raise invalid(f"structured_outputs: unsupported keys {unknown}; use one of {', '.join(KINDS)}",
                              "structured_outputs", "unsupported_parameter")
            spec = {k: v for k, v in self.structured_outputs.items() if v is not None}
            return StructuredOutputs(**spec, source=source)
        return StructuredOutputs(**{legacy[source]: getattr(self, source)}, source=source)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # the worker's tool-call parser and whether `auto` calls are constrained; set before tool_mode is read
    _tool_parser: ToolParser | None = PrivateAttr(default=None)
    _tool_constrained: bool = PrivateAttr(default=True)

    def use_tool_parser(self, parser: ToolParser | None, constrained: bool = True) -> None:
        self._tool_parser, self._tool_constrained = parser, constrained

    @cached_property
    def tool_mode(self) -> ToolMode | None:
        """What tools / tool_choice ask for (tools.py); None: a text answer. Parsed once per request."""
        return parse_tools(self.tools, self.tool_choice, self.parallel_tool_calls, self._tool_parser,
                           self._tool_constrained)

    def structured(self) -> StructuredOutputs | None:
        mode = self.tool_mode
        spec = super().structured()
        if mode is None:
            return spec
        if spec is not None:
            raise invalid(f"{spec.source}: cannot be combined with tool_choice {mode.kind!r}", spec.source)
        return mode.structured()

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """The engine's `logprobs`: alternatives per token, or None when not asked for."""
        if not self.logprobs:
            if self.top_logprobs:
                raise invalid("top_logprobs: requires logprobs to be true", "top_logprobs")
            return None
        return self.top_logprobs or 0

    def conversation(self) -> list[dict[str, Any]]:
        """Messages as the chat template takes them; content parts must be text."""
        if not self.messages:
            raise invalid("messages: must contain at least one message", "messages")
        out = []
        for i, m in enumerate(self.messages):
            content = m.content
            if isinstance(content, list):
                if any(p.type != "text" or p.text is None for p in content):
                    raise invalid(f"messages[{i}].content: only text content parts are supported",
                                  f"messages[{i}].content", "unsupported_parameter")
                content = "".join(p.text or "" for p in content)
            msg: dict[str, Any] = {"role": m.role, "content": content or ""}
            if m.name is not None:
                msg["name"] = m.name
            if m.tool_calls:
                msg["tool_calls"] = m.tool_calls
            if m.tool_call_id is not None:
                msg["tool_call_id"] = m.tool_call_id
            out.append(template_message(msg))
        return out


class CompletionRequest(GenerationRequest):
    prompt: Any = None  # str | list[str] | list[int] | list[list[int]], checked in prompts()
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    @property
    def engine_prompt_logprobs(self) -> int | None:
        """`echo` with `logprobs: k` returns the prompt's logprobs too, k alternatives each."""
        asked = super().engine_prompt_logprobs
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, asked or 0)
        return asked

    def prompts(self) -> list[str | list[int]]:
        """The batch this request asks for: strings or token-id lists, one per prompt."""
        if self.suffix:
            raise invalid("suffix is not supported by this worker.", "suffix", "unsupported_parameter")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise invalid("best_of: only best_of == n is supported", "best_of", "unsupported_parameter")
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p, list) and p:
            if all(isinstance(x, str) for x in p):
                return list(p)
            if all(_is_token(x) for x in p):
                return [list(p)]
            if all(isinstance(x, list) and x and all(_is_token(t) for t in x) for x in p):
                return [list(x) for x in p]
        raise invalid("prompt: must be a string, an array of strings, an array of token ids or an array of "
                      "token-id arrays, and not empty", "prompt", "invalid_type" if p is not None else
                      "missing_required_parameter")


def _is_token(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise WorkerError(f"The model `{requested}` does not exist (this worker serves `{served}`).",
                          status=404, code="model_not_found", param="model")


def _response_format(fmt: dict[str, Any]) -> StructuredOutputs:
    """OpenAI's response_format: {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}."""
    kind = fmt.get("type")
    if kind == "json_object":
        schema = response_format_schema(fmt)  # the `schema` convention several hosted platforms accept
        if schema is not None:
            return StructuredOutputs(json=schema, source="response_format")
        return StructuredOutputs(json_object=True, source="response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise invalid("response_format.json_schema: required, an object with a name and a schema",
                          "response_format.json_schema")
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise invalid("response_format.json_schema.name: required, a non-empty string",
                          "response_format.json_schema.name")
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise invalid("response_format.json_schema.schema: required, a JSON schema object",
                          "response_format.json_schema.schema")
        return StructuredOutputs(json=schema, source="response_format")
    raise invalid(f"response_format.type: {kind!r} is not supported; use 'text', 'json_object' or 'json_schema'",
                  "response_format.type")
