"""The three tool-call parsers, whole and streamed: calls, text around them, botched calls as content."""

from __future__ import annotations

import json

import pytest

from dataplane.worker.tool_parsers import ToolSpec, get_parser, guess_parser
from dataplane.worker.tool_parsers.stream import ToolStream
from dataplane.worker.tools import parse_tools

WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TIME = ToolSpec("get_time", {"type": "object", "properties": {}})
TOOLS = {t.name: t for t in (WEATHER, TIME)}

HERMES_TWO = ('Checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
LLAMA_TWO = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'
PYTHONIC_TWO = '[get_weather(city="Paris"), get_time()]'


def _calls(parsed):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls]


@pytest.mark.parametrize(("name", "text", "content"), [
    ("hermes", HERMES_TWO, "Checking."),
    ("llama3_json", LLAMA_TWO, None),
    ("llama3_json", "<|python_tag|>" + LLAMA_TWO, None),
    ("pythonic", PYTHONIC_TWO, None),
    ("pythonic", "<|python_start|>" + PYTHONIC_TWO + "<|python_end|>", None),
])
def test_two_calls_parse_whole(name, text, content):
    parsed = get_parser(name).parse(text, TOOLS)
    assert _calls(parsed) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert parsed.content == content
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in parsed.calls)
    assert len({c["id"] for c in parsed.calls}) == 2


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "pythonic"])
@pytest.mark.parametrize("botched", [
    "Just text, no call.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',  # cut off
    '<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>',  # not a given tool
    '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',  # arguments not an object
    '{"name": "get_weather", "parameters": {"city": "Paris"',  # llama, cut off
    '{"name": "nope", "parameters": {}}',
    '[get_weather(city=os.system("rm -rf /"))]',  # pythonic: not a literal, never evaluated
    '[get_weather("Paris")]',  # positional
    '[nope()]',
    "[" * 5000,  # deep nesting must not crash the parser
])
def test_botched_calls_are_content(name, botched):
    parsed = get_parser(name).parse(botched, TOOLS)
    assert parsed.calls == [] and parsed.content == botched
    events = _stream(name, botched, 3)
    assert [k for k, _ in events] in ([], ["content"] * len(events))
    assert "".join(v for _, v in events).strip() == botched.strip()


def test_hermes_keeps_a_botched_call_as_content_beside_a_good_one():
    text = ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    parsed = get_parser("hermes").parse(text, TOOLS)
    assert _calls(parsed) == [("get_time", {})]
    assert parsed.content == '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'


def test_parallel_false_keeps_one_call():
    parsed = get_parser("hermes").parse(HERMES_TWO, TOOLS, parallel=False)
    assert _calls(parsed) == [("get_weather", {"city": "Paris"})]
    assert "get_time" in parsed.content
    assert get_parser("llama3_json").parse(LLAMA_TWO, TOOLS, parallel=False).calls == []


def _stream(name, text, size, parallel=True):
    s = ToolStream(get_parser(name), TOOLS, parallel)
    events = []
    for i in range(0, len(text), size):
        events += s.feed(text[i:i + size])
    return events + s.finish()


@pytest.mark.parametrize(("name", "text"), [("hermes", HERMES_TWO), ("llama3_json", LLAMA_TWO),
                                            ("pythonic", PYTHONIC_TWO)])
@pytest.mark.parametrize("size", [1, 2, 7, 1000])
def test_streamed_as_whole(name, text, size):
    events = _stream(name, text, size)
    calls = [(v["function"]["name"], json.loads(v["function"]["arguments"])) for k, v in events if k == "call"]
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    content = "".join(v for k, v in events if k == "content")
    assert content == ("Checking." if name == "hermes" else "")
    assert "<" not in content  # no piece of a tag leaks as content


def test_hermes_streams_text_before_a_call_at_once_and_holds_a_partial_tag():
    s = ToolStream(get_parser("hermes"), TOOLS)
    assert s.feed("Let me look") == [("content", "Let me look")]
    assert s.feed(" that up <tool") == [("content", " that up")]  # "<tool" could open a call
    assert s.feed("box> is not a call") == [("content", " <toolbox> is not a call")]


def test_streamed_text_answer_goes_out_as_it_comes():
    s = ToolStream(get_parser("llama3_json"), TOOLS)
    assert s.feed("  ") == []
    assert s.feed("Hello") == [("content", "  Hello")]
    assert s.feed(" there") == [("content", " there")]
    s = ToolStream(get_parser("pythonic"), TOOLS)
    assert s.feed("<|python") == []  # could be <|python_start|>
    assert s.feed("_start|>[get_time()]<|python_end|>") == []
    assert [k for k, _ in s.finish()] == ["call"]


def test_guess_parser_from_the_template():
    assert guess_parser("{{ '<|im_start|>' + role }}") == "hermes"
    assert guess_parser("... <|python_tag|> ... ipython ...") == "llama3_json"
    assert guess_parser("[INST] {{ content }} [/INST]") is None
    with pytest.raises(ValueError, match="tool_call_parser"):
        get_parser("mistral")


def test_auto_without_a_parser_is_refused_and_with_one_is_constrained():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER.parameters}}]
    with pytest.raises(Exception, match="tool-call parser") as exc:
        parse_tools(tools, None, None)
    assert exc.value.param == "tool_choice"
    mode = parse_tools(tools, "auto", False, get_parser("hermes"))
    assert mode.kind == "auto" and not mode.parallel and mode.structured().kind == "grammar"
    assert parse_tools(tools, None, None, get_parser("hermes"), constrained=False).structured() is None
    assert parse_tools(tools, None, None, get_parser("pythonic")).structured() is None  # no grammar for it
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": "x"}}}]
    with pytest.raises(Exception) as exc:
        parse_tools(bad, None, None, get_parser("hermes")).structured()
    assert exc.value.param == "tools[0].function.parameters"
