"""The chat template a tool conversation is rendered with.

A ChatML model whose own template has no tool syntax (SmolLM2's ignores `tools` and prints tool
turns as bare roles) gets the template shipped in dataplane/worker/templates/chatml_tools.jinja,
which lists the tools and shows calls and results in the Hermes syntax the `hermes` parser reads.
A model whose template knows tools keeps its own.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


@cache
def shipped(name: str) -> str:
    return (TEMPLATES / name).read_text()


def tool_template(parser: str | None, model_template: str | None) -> str | None:
    """The shipped template to use for tool conversations, or None to keep the model's own."""
    if parser == "hermes" and "<|im_start|>" in (model_template or "") and "tools" not in (model_template or ""):
        return shipped("chatml_tools.jinja")
    return None


def uses_tools(messages: list[dict[str, Any]], tools: list[Any] | None) -> bool:
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def render(hf_tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any] | None, template: str) -> list[int]:
    out = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, tools=tools or None,
                                           chat_template=template)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
