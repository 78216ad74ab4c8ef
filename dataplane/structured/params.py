"""What a request constrains its output to: plain data, validated before anything is compiled.

After vLLM's `StructuredOutputsParams`: exactly one of `json` (a JSON schema), `json_object` (any
JSON object), `regex`, `choice` (one of a list of strings) or `grammar` (EBNF, in xgrammar's
dialect of GBNF). `source` is the request field it came from, so errors name what the caller sent
(`response_format`, `structured_outputs`, ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# A constraint's text (schema, regex, grammar, choices) at most this long: compiling is superlinear in
# it and runs on the worker's threads, so one request must not buy seconds of them.
MAX_SPEC_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class StructuredOutputs:
    json: str | None = None  # a JSON schema, serialized (dicts are serialized at construction)
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    source: str = field(default="structured_outputs", compare=False)

    def __post_init__(self) -> None:
        src = self.source
        if isinstance(self.json, dict | bool):
            try:
                object.__setattr__(self, "json", json.dumps(self.json, separators=(",", ":")))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{src}: the JSON schema cannot be serialized: {exc}") from None
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, list | tuple):
                raise ValueError(f"{src}: choice must be a list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"{src}: exactly one of {', '.join(KINDS)} must be given"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.json is not None:
            if not isinstance(self.json, str):
                raise ValueError(f"{src}: the JSON schema must be an object")
            try:
                schema = json.loads(self.json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{src}: the JSON schema is not valid JSON: {exc}") from None
            if not isinstance(schema, dict | bool):
                raise ValueError(f"{src}: the JSON schema must be an object")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError(f"{src}: regex must be a non-empty string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"{src}: grammar must be a non-empty string")
        if self.choice is not None and (not self.choice or any(not isinstance(c, str) or not c for c in self.choice)):
            raise ValueError(f"{src}: choice must be a non-empty list of non-empty strings")
        size = len(self.key[1])
        if size > MAX_SPEC_CHARS:
            raise ValueError(f"{src}: the {self.kind} is {size} characters; at most {MAX_SPEC_CHARS} are accepted")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple[str, str]:
        """What the compiled grammar depends on (the compile cache's key)."""
        value = getattr(self, self.kind)
        return self.kind, json.dumps(value) if isinstance(value, tuple) else str(value)

