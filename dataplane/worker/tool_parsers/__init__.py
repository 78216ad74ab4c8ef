"""Tool-call parsers, chosen per model as vLLM's `--tool-call-parser` (hermes, llama3_json, pythonic)."""

from __future__ import annotations

from dataplane.worker.tool_parsers.base import Parsed, ToolParser, ToolSpec, call
from dataplane.worker.tool_parsers.hermes import HermesParser
from dataplane.worker.tool_parsers.llama3_json import Llama3JsonParser
from dataplane.worker.tool_parsers.pythonic import PythonicParser

PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Llama3JsonParser, PythonicParser)}


def get_parser(name: str) -> ToolParser:
    if name not in PARSERS:
        raise ValueError(f"tool_call_parser: {name!r} is not one of {sorted(PARSERS)} (or 'auto', 'none')")
    return PARSERS[name]()


def guess_parser(chat_template: str | None) -> str | None:
    """The parser a model's own chat template implies: Llama 3's tool turns, else ChatML's tags
    (hermes; the shipped template teaches a ChatML model without tool syntax), else none."""
    template = chat_template or ""
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    if "<|im_start|>" in template:
        return "hermes"
    return None


__all__ = ["PARSERS", "Parsed", "ToolParser", "ToolSpec", "call", "get_parser", "guess_parser"]
