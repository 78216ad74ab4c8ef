"""Grammars for structured outputs, compiled once per tokenizer with xgrammar (vLLM's default backend).

The engine compiles a request's grammar when it is made (so a bad schema is a ValueError before
anything is queued); the runner builds a matcher per running request from the same cache, fills a
bitmask of the tokens the grammar allows next, and advances the matcher by the sampled token.

Choices (kept where a request is silent, as vLLM users would expect):
- JSON is compact: no whitespace between tokens beyond what the schema's strings hold. xgrammar's
  default (`any_whitespace`) lets a small model fill its budget with newlines and spaces, which
  is valid JSON and useless; vLLM exposes the same switch as `disable_any_whitespace`.
- `json_object` (OpenAI's JSON mode) is any JSON *object*, as at OpenAI, not any JSON value.
- A matcher is rebuilt for a preempted request from its output tokens: the grammar state is a
  function of them, so recompute-preemption needs no saved state.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import torch

from dataplane.structured.params import StructuredOutputs

# Compiled grammars kept per engine (least recently used dropped): one per distinct schema/regex.
CACHE_ENTRIES = 256
# xgrammar errors read "[12:00:00] /project/cpp/file.cc:123: message"; callers want the message.
_XGR_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*\S+:\d+:\s*")


def _xgr() -> Any:
    import xgrammar

    return xgrammar


class GrammarBackend:
    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._compiler: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.num_compiled = 0

    def _get_compiler(self) -> Any:
        # Built on first use: reading the vocabulary takes ~0.4 s, which engines that never see a
        # structured request should not pay at start.
        with self._lock:
            if self._compiler is None:
                xgr = _xgr()
                info = xgr.TokenizerInfo.from_huggingface(self.hf_tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.eos_token_ids)
                # Our own bounded cache below; xgrammar's would grow without limit.
                self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler

    def compile(self, spec: StructuredOutputs) -> Any:
        """The compiled grammar for `spec`; ValueError naming `spec.source` if it is not valid."""
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = self._compile(self._get_compiler(), spec)
        with self._lock:
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
            self.num_compiled += 1
        return compiled

    @staticmethod
    def _compile(compiler: Any, spec: StructuredOutputs) -> Any:
        kind, src = spec.kind, spec.source
        what = {"json": "JSON schema", "json_object": "JSON schema", "regex": "regex", "choice": "choice",
                "grammar": "grammar"}[kind]
        try:
            if kind == "json":
                return compiler.compile_json_schema(spec.json, any_whitespace=False)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(spec.regex)
            if kind == "choice":
                # EBNF string literals take JSON's escapes, so any choice text is spelled exactly.
                return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in spec.choice))
            return compiler.compile_grammar(spec.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            message = _XGR_PREFIX.sub("", str(exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{src}: invalid {what}: {message}") from None

    def matcher(self, spec: StructuredOutputs, output_token_ids: list[int]) -> Matcher:
        """A matcher at the state after `output_token_ids` (none for a new request)."""
        m = Matcher(_xgr().GrammarMatcher(self.compile(spec)))
        for t in output_token_ids:
            if not m.accept(t):
                raise ValueError(f"{spec.source}: the output so far does not match the grammar")
        return m

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return _xgr().allocate_token_bitmask(rows, self.vocab_size)

    @staticmethod
    def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """logits[r] keeps only the tokens bitmask[r] allows (others become -inf), for r in rows; in place.
        bitmask has as many rows as logits (xgrammar indexes both by r)."""
        _xgr().apply_token_bitmask_inplace(logits, bitmask, indices=rows)


class Matcher:
    """One request's position in its grammar."""

    __slots__ = ("_m",)

    def __init__(self, m: Any) -> None:
        self._m = m

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(token_id))

    @property
    def terminated(self) -> bool:
        return bool(self._m.is_terminated())
