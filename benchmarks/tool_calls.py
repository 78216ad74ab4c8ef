"""tool_choice "auto" on the real model: how many calls are valid with and without the constraint,
and what the constraint costs in tokens/s.

    python -m benchmarks.tool_calls [--max-tokens 40] [--concurrency 16] [--single-stream]

60 chat prompts with four tools offered (get_weather, get_time, convert_currency, search_web): half
need a tool, half do not. Each runs through the worker's own path for `auto` (the hermes parser, the
shipped ChatML tool template, SmolLM2-135M-Instruct) in the same engine, constrained (once
`<tool_call>` is written, the rest is held to a call of a given tool, tool_parsers/grammar.py) and
free (the parser alone, as vLLM does). Greedy decoding.

- as asked: the prompts as they are. SmolLM2-135M almost never opens a call by itself.
- call opened: the same prompts with the assistant's answer begun with `<tool_call>` (appended to
  the prompt), the state the constraint takes over in. Constrained, the rest is held to what the
  production grammar allows after its trigger (a call of one of the tools, then `</tool_call>`);
  free, the model writes the rest alone. A call counts as valid when the hermes parser returns it
  from `<tool_call>` + the answer and its arguments validate against the tool's schema (jsonschema).
- tokens/s: output tokens over wall time at the given concurrency (as asked: the grammar's free-text
  cost, as its mask is filled at every step, call or not), and with --single-stream at concurrency 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema
import xgrammar as xgr

from benchmarks.common import environment, fmt, write_results
from dataplane import SamplingParams
from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig
from dataplane.engine.core import EngineCore
from dataplane.models.loader import load_configured
from dataplane.structured.params import StructuredOutputs
from dataplane.worker.tool_parsers import ToolSpec, get_parser
from dataplane.worker.tool_parsers import template as tool_templates
from dataplane.worker.tools import ToolMode

MODEL = "smollm2-135m-instruct"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                    "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current local time in an IANA time zone",
     "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"],
                    "additionalProperties": False}}},
    {"type": "function", "function": {"name": "convert_currency", "description": "Convert an amount between currencies",
     "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "from": {"type": "string"},
                    "to": {"type": "string"}}, "required": ["amount", "from", "to"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "search_web", "description": "Search the web",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
                    "additionalProperties": False}}},
]
SPECS = [ToolSpec(t["function"]["name"], t["function"]["parameters"]) for t in TOOLS]
CITIES = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Seoul", "Quito", "Perth", "Dublin"]
NEED = ([f"What's the weather in {c} right now?" for c in CITIES]
        + [f"What time is it in {z}?" for z in ("Europe/Berlin", "Asia/Tokyo", "America/Lima", "Africa/Lagos",
                                               "Australia/Perth")]
        + [f"Convert {a} {f} to {t}." for a, f, t in ((100, "USD", "EUR"), (250, "GBP", "JPY"), (12.5, "EUR", "CHF"),
                                                       (9000, "INR", "USD"), (40, "CAD", "MXN"))]
        + [f"Search the web for {q}." for q in ("the latest Python release", "the tallest building in 2026",
                                                 "reviews of the Fairphone 5", "train times from Lyon to Turin",
                                                 "the population of Lagos", "today's top news",
                                                 "who won the last world cup", "open-source vector databases",
                                                 "a vegan lasagne recipe", "the price of copper")])
NO_NEED = ["Tell me a joke about cats.", "What is 17 times 3?", "Write a haiku about autumn.",
           "Say hello in Spanish.", "What is the capital of Italy?", "Give me a synonym for happy.",
           "Explain what a noun is.", "Name three primary colours.", "What does CPU stand for?",
           "Write one sentence about the sea.", "How many legs does a spider have?", "Spell 'necessary'.",
           "What is the opposite of cold?", "Suggest a name for a dog.", "What is 2 plus 2?",
           "Describe a rainbow in one line.", "What sound does a cow make?", "Give me a fun fact about bees.",
           "What is the plural of mouse?", "Translate 'thank you' into French.", "Who wrote Hamlet?",
           "What is water made of?", "Name a fruit that is yellow.", "Count from one to five.",
           "What day comes after Monday?", "What is a triangle?", "Recommend a book for children.",
           "What colour is the sky on a clear day?", "Finish the phrase: once upon a...", "Say something kind."]


def call_valid(call: dict) -> bool:
    spec = next((s for s in SPECS if s.name == call["function"]["name"]), None)
    try:
        jsonschema.validate(json.loads(call["function"]["arguments"]), spec.parameters)  # type: ignore[union-attr]
        return spec is not None
    except (ValueError, jsonschema.ValidationError, AttributeError):
        return False


def opened_spec() -> StructuredOutputs:
    """After `<tool_call>`: what the production grammar's tags allow (tool_parsers/grammar.py), alone."""
    tags = [{"type": "tag", "begin": f'\n{{"name": {json.dumps(t.name)}, "arguments": ',
             "content": {"type": "grammar", "grammar": str(xgr.Grammar.from_json_schema(json.dumps(t.parameters),
                                                                                     any_whitespace=False))},
             "end": "}\n</tool_call>"} for t in SPECS]
    st = {"type": "structural_tag", "format": {"type": "or", "elements": tags}}
    return StructuredOutputs(grammar=str(xgr.Grammar.from_structural_tag(json.dumps(st))), source="tools")


def run(core: EngineCore, work: list[list[int]], constrained: bool, opened: bool, max_tokens: int,
        concurrency: int) -> dict:
    parser = get_parser("hermes")
    mode = ToolMode("auto", tuple(SPECS), True, parser, constrained)
    spec = (opened_spec() if opened else mode.structured()) if constrained else None
    head = "<tool_call>" if opened else ""
    texts: dict[int, str] = {}
    tokens, start, pending = 0, time.perf_counter(), list(enumerate(work))
    running = 0
    while pending or core.has_unfinished():
        while pending and running < concurrency:
            i, p = pending.pop(0)
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, structured=spec)
            rid, text, children = core.make_requests(p, params, request_id=str(i))
            core.add(rid, text, children)
            running += 1
        for o in core.step():
            if o.finished:  # offline outputs are whole: the text and every token id so far
                texts[int(o.request_id)] = o.outputs[0].text
                tokens += len(o.outputs[0].token_ids)
                running -= 1
    elapsed = time.perf_counter() - start
    out = {"need": {"answers": 0, "with_calls": 0, "opened": 0, "calls": 0, "valid_calls": 0},
           "no_need": {"answers": 0, "with_calls": 0, "opened": 0, "calls": 0, "valid_calls": 0}}
    for i, text in texts.items():
        row = out["need" if i < len(NEED) else "no_need"]
        parsed = parser.parse(head + text, mode.by_name)
        botched = (parsed.content or "").count("<tool_call>")
        row["answers"] += 1
        row["with_calls"] += bool(parsed.calls)
        row["opened"] += len(parsed.calls) + botched
        row["calls"] += len(parsed.calls)
        row["valid_calls"] += sum(call_valid(c) for c in parsed.calls)
    out.update(tokens=tokens, seconds=elapsed, tok_s=tokens / elapsed, example=head + texts.get(0, ""),
               example_no_tool=head + texts.get(len(NEED), ""))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--name", default="tool_calls")
    ap.add_argument("--single-stream", action="store_true", help="also 10 prompts at concurrency 1")
    ap.add_argument("--cost-rounds", type=int, default=0,
                    help="only the tok/s cost: this many interleaved constrained/free rounds of 16 prompts")
    args = ap.parse_args()
    mc = ModelConfig(MODEL)
    loaded = load_configured(mc, progress=False)
    tok = loaded.tokenizer
    template = tool_templates.tool_template("hermes", tok.hf.chat_template)
    assert template is not None
    work = [tool_templates.render(tok.hf, [{"role": "user", "content": q}], TOOLS, template) for q in NEED + NO_NEED]
    tag = tok.hf.encode("<tool_call>", add_special_tokens=False)
    core = EngineCore(mc, CacheConfig(kv_cache_memory="1GiB"),
                      SchedulerConfig(max_num_seqs=args.concurrency, max_num_batched_tokens=1024),
                      progress=False, preloaded=loaded)
    run(core, work[:2], True, False, 4, args.concurrency)  # warm-up, compiles the grammars
    run(core, [w + tag for w in work[:2]], True, True, 4, args.concurrency)
    results: dict = {"env": environment(), "lscpu": _lscpu(), "prompts": {"need_tool": len(NEED),
                     "no_tool": len(NO_NEED)}, "max_tokens": args.max_tokens, "runs": {}}
    if args.cost_rounds:
        cost_rounds(core, work, args)
        return
    for opened in (False, True):
        prompts = [w + tag for w in work] if opened else work
        for constrained in (True, False):
            key = f"{'constrained' if constrained else 'free'}_{'opened' if opened else 'asked'}_c{args.concurrency}"
            res = results["runs"][key] = run(core, prompts, constrained, opened, args.max_tokens, args.concurrency)
            print(key, json.dumps({k: v for k, v in res.items() if not k.startswith("example")}), flush=True)
    if args.single_stream:
        for constrained in (True, False):
            key = f"{'constrained' if constrained else 'free'}_asked_c1"
            res = results["runs"][key] = run(core, work[:10], constrained, False, args.max_tokens, 1)
            print(key, f"{res['tok_s']:.1f} tok/s", flush=True)
    write_results(args.name, results, table(results, args))


def cost_rounds(core: EngineCore, work: list[list[int]], args: argparse.Namespace) -> None:
    """Constrained and free back to back, round after round, so that other load hits both alike."""
    sample = work[::4][:16]  # 8 that need a tool, 8 that do not
    rounds: list[dict] = []
    for m in (True, False):  # warm-up: the first runs after loading are slower for both
        run(core, sample, m, False, args.max_tokens, args.concurrency)
    for r in range(args.cost_rounds):
        got = {m: run(core, sample, m == "constrained", False, args.max_tokens, args.concurrency)["tok_s"]
               for m in (("constrained", "free") if r % 2 == 0 else ("free", "constrained"))}
        rounds.append(got)
        print(f"round {r}: constrained {got['constrained']:.1f} tok/s, free {got['free']:.1f}", flush=True)
    median = statistics.median(x["constrained"] / x["free"] for x in rounds)
    env = environment()
    table = (f"# Tool calls, the constraint's tok/s cost (`python -m benchmarks.tool_calls --cost-rounds "
             f"{args.cost_rounds} --name {args.name}`)\n\n| round | constrained tok/s | free tok/s | ratio |\n"
             "|---:|---:|---:|---:|\n"
             + "".join(f"| {i} | {x['constrained']:.1f} | {x['free']:.1f} | {x['constrained'] / x['free']:.2f} |\n"
                       for i, x in enumerate(rounds))
             + f"\nMedian ratio **{median:.2f}** (16 prompts as asked, concurrency {args.concurrency}, max_tokens "
             f"{args.max_tokens}, greedy; the order alternates each round). CPU: {env['cpu']} ({env['threads']} "
             f"threads), {env['when']}.")
    print(table)
    write_results(args.name, {"env": env, "lscpu": _lscpu(), "rounds": rounds, "median_ratio": median}, table)


def _lscpu() -> str:
    import subprocess

    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return ""


def table(results: dict, args: argparse.Namespace) -> str:
    c = args.concurrency
    rows = ["| answer | mode | tool prompts answered with a call | no-tool prompts answered with a call "
            "| calls opened | valid calls (parsed + schema) | output tok/s |", "|---|---|---:|---:|---:|---:|---:|"]
    for opened in ("asked", "opened"):
        for mode in ("constrained", "free"):
            r = results["runs"][f"{mode}_{opened}_c{c}"]
            n_open = r["need"]["opened"] + r["no_need"]["opened"]
            valid = r["need"]["valid_calls"] + r["no_need"]["valid_calls"]
            share = f"**{valid}/{n_open} ({valid / n_open:.0%})**" if n_open else "0/0"
            label = "as asked" if opened == "asked" else "begun with `<tool_call>`"
            rows.append(f"| {label} | {mode} | {r['need']['with_calls']}/{r['need']['answers']} "
                        f"| {r['no_need']['with_calls']}/{r['no_need']['answers']} | {n_open} | {share} "
                        f"| {fmt(r['tok_s'])} |")
    asked = {m: results["runs"][f"{m}_asked_c{c}"]["tok_s"] for m in ("constrained", "free")}
    cost = (f"As asked (free text under the grammar, its mask filled at every step), constrained "
            f"{asked['constrained']:.1f} tok/s vs free {asked['free']:.1f} ({asked['constrained'] / asked['free'] - 1:+.1%}).")
    if "constrained_asked_c1" in results["runs"]:
        c1 = {m: results["runs"][f"{m}_asked_c1"]["tok_s"] for m in ("constrained", "free")}
        cost += (f" At concurrency 1 (10 prompts): constrained {c1['constrained']:.1f} tok/s, free {c1['free']:.1f} "
                 f"({c1['constrained'] / c1['free'] - 1:+.1%}).")
    env = results["env"]
    return "\n".join([
        f"# Tool calls, `tool_choice: \"auto\"` (`python -m benchmarks.tool_calls`), {MODEL}, greedy, "
        f"max_tokens {args.max_tokens}, concurrency {c}", "", *rows, "",
        f"{cost} {results['prompts']['need_tool']} prompts need a tool, "
        f"{results['prompts']['no_tool']} do not. A call is valid when the hermes parser returns it and its arguments "
        f"validate against the tool's schema; an opened `<tool_call>` that does not parse stays content and counts "
        f"as invalid. CPU: {env['cpu']} ({env['threads']} threads), {env['when']}; a machine shared with other work, "
        f"so tok/s moves between runs by more than the constraint's cost.", "",
        f"Example, begun with `<tool_call>`, constrained: `{results['runs'][f'constrained_opened_c{c}']['example']!r}`",
        "", f"Example, begun with `<tool_call>`, free: `{results['runs'][f'free_opened_c{c}']['example']!r}`",
    ])


if __name__ == "__main__":
    main()
