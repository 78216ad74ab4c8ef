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
- Compiles have a deadline (`compile_timeout`, 10 s by default): a grammar is first compiled in a
  child process that is killed when it overruns (compile_process.py; the request gets a ValueError
  naming its field, a 400 from the worker), then, having proved it finishes in time, here.
  `compile_timeout=None` skips the child: in-process only, no deadline.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import torch

from dataplane.structured.compile_process import CompileFailed, CompilePool, CompileTimeout
from dataplane.structured.params import StructuredOutputs

# Compiled grammars kept per engine (least recently used dropped): one per distinct schema/regex.
CACHE_ENTRIES = 256
# xgrammar errors read "[12:00:00] /project/cpp/file.cc:123: message"; callers want the message.
_XGR_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*\S+:\d+:\s*")
# Seconds a grammar may take to compile. Measured on the test machine's shared EPYC (SmolLM2's 49k
# vocabulary): JSON mode 3 ms, a 4-field person schema 60 ms, a string with maxLength 0.4-0.9 s, 20
# string fields with distinct maxLength 8 s (each distinct bounded string is ~0.4 s); a hostile 64 KiB
# schema runs for minutes. 10 s passes every real schema we measured and caps the damage.
DEFAULT_COMPILE_TIMEOUT = 10.0
_WHAT = {"json": "JSON schema", "json_object": "JSON schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def _xgr() -> Any:
    import xgrammar  # lazy: heavy, ~1.3 s after torch; only once a request asks for structured output

    return xgrammar


class GrammarBackend:
    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...],
                 compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT, compile_processes: int = 1) -> None:
        if compile_timeout is not None and not compile_timeout > 0:
            raise ValueError(f"grammar_compile_timeout: must be > 0 seconds (or None: no deadline), got {compile_timeout}")
        if compile_processes < 1:
            raise ValueError(f"grammar_compile_processes: must be >= 1, got {compile_processes}")
        self.hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.compile_timeout = compile_timeout
        self.compile_processes = compile_processes
        self._info: Any = None
        self._compiler: Any = None
        self._pool: CompilePool | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.num_compiled = 0

    def _get_info(self) -> Any:
        # Built on first use: reading the vocabulary takes ~0.4 s, which engines that never see a
        # structured request should not pay at start.
        with self._lock:
            if self._info is None:
                self._info = _xgr().TokenizerInfo.from_huggingface(self.hf_tokenizer, vocab_size=self.vocab_size,
                                                                   stop_token_ids=self.eos_token_ids)
            return self._info

    def _get_compiler(self) -> Any:
        info = self._get_info()
        with self._lock:
            if self._compiler is None:
                # Our own bounded cache below; xgrammar's would grow without limit.
                self._compiler = _xgr().GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler

    def _get_pool(self) -> CompilePool:
        info = self._get_info()
        with self._lock:
            if self._pool is None:
                self._pool = CompilePool(info.serialize_json(), self.compile_processes, max_threads=2)
            return self._pool

    def close(self) -> None:
        """Stop the compile children (they also exit by themselves when this process does)."""
        if self._pool is not None:
            self._pool.close()

    def compile(self, spec: StructuredOutputs) -> Any:
        """The compiled grammar for `spec`; ValueError naming `spec.source` if it is not valid."""
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = self._compile(spec) if self.compile_timeout is None else self._compile_isolated(spec)
        with self._lock:
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
            self.num_compiled += 1
        return compiled

    def _compile_isolated(self, spec: StructuredOutputs) -> Any:
        """First in a child process, killed at the deadline (ValueError naming `spec.source`), then here."""
        timeout, src, what = self.compile_timeout, spec.source, _WHAT[spec.kind]
        assert timeout is not None
        kind, text = spec.kind, {"json": spec.json, "regex": spec.regex, "grammar": spec.grammar}.get(spec.kind)
        if kind == "choice":
            kind, text = "grammar", _choice_grammar(spec.choice or ())
        try:
            # Waiting for a busy child is bounded too (CompileBusy is a QueueFullError: 429, retry).
            self._get_pool().compile(kind, text or "", timeout, wait=timeout)
        except CompileTimeout:
            raise ValueError(f"{src}: the {what} did not compile within {timeout:g} s, this worker's limit; "
                             "simplify it (fewer distinct maxLength/maxItems bounds, smaller repetition counts, "
                             "fewer alternatives)") from None
        except CompileFailed as exc:
            raise ValueError(f"{src}: invalid {what}: {_clean(str(exc))}") from None
        return self._compile(spec)

    def _compile(self, spec: StructuredOutputs) -> Any:
        compiler = self._get_compiler()
        kind, src = spec.kind, spec.source
        what = _WHAT[kind]
        try:
            if kind == "json":
                return compiler.compile_json_schema(spec.json, any_whitespace=False)
            if kind == "json_object":
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(spec.regex)
            if kind == "choice":
                return compiler.compile_grammar(_choice_grammar(spec.choice))
            return compiler.compile_grammar(spec.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"{src}: invalid {what}: {_clean(str(exc)) or type(exc).__name__}") from None

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


def _choice_grammar(choice: tuple[str, ...]) -> str:
    # EBNF string literals take JSON's escapes, so any choice text is spelled exactly.
    return "root ::= " + " | ".join(json.dumps(c) for c in choice)


def _clean(message: str) -> str:
    """xgrammar's message without its "[time] file.cc:line:" prefix, first line only."""
    return _XGR_PREFIX.sub("", message).strip().splitlines()[0] if message.strip() else ""


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
