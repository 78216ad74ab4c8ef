"""Grammar compile time per schema: in-process (no deadline, the peer) vs child probe + in-process (deadline).

    python -m benchmarks.grammar_compile [--rounds 3] [--deadline 10] [--name grammar_compile]

What the default `grammar_compile_timeout` (10 s) was chosen from: real schemas (JSON mode, a person,
an order with a pattern and an enum, a tool call, bounded strings) and the kind of schema that burns a
core (many string fields, each with its own maxLength). With a deadline a grammar is compiled
twice: in a child process killed at the deadline, then (having finished in time) in-process; the
deadline applies to the child's part. Each compile is a first compile (the backend's cache is cleared). SmolLM2-135M's tokenizer
(49k tokens). Writes benchmarks/results/<name>.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import environment, write_results
from dataplane.models.registry import resolve_model_path
from dataplane.models.tokenizer import Tokenizer
from dataplane.structured.backend import GrammarBackend
from dataplane.structured.params import StructuredOutputs

MODEL = "smollm2-135m-instruct"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                                           "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 4}},
          "required": ["name", "age", "languages"]}
ORDER = {"type": "object", "properties": {
    "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
    "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}, "required": ["sku", "qty"]}}},
    "required": ["id", "status", "items"]}
TOOL = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}}, "required": ["name", "arguments"]}


def distinct_bounded_strings(n: int) -> dict:
    return {"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 100 + i} for i in range(n)}}


CASES = [
    ("JSON mode", StructuredOutputs(json_object=True)),
    ("person", StructuredOutputs(json=PERSON)),
    ("order (pattern, enum, nested)", StructuredOutputs(json=ORDER)),
    ("tool call", StructuredOutputs(json=TOOL)),
    ("string maxLength 1000", StructuredOutputs(json={"type": "string", "maxLength": 1000})),
    ("regex [A-Z]{3}-[0-9]{4}", StructuredOutputs(regex="[A-Z]{3}-[0-9]{4}")),
    ("5 strings, distinct maxLength", StructuredOutputs(json=distinct_bounded_strings(5))),
    ("20 strings, distinct maxLength", StructuredOutputs(json=distinct_bounded_strings(20))),
    ("40 strings, distinct maxLength (hostile)", StructuredOutputs(json=distinct_bounded_strings(40))),
]


def timed(backend: GrammarBackend, spec: StructuredOutputs) -> float | None:
    backend._cache.clear()
    start = time.perf_counter()
    try:
        backend.compile(spec)
    except ValueError as exc:
        if "did not compile within" in str(exc):
            return None
        raise
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=10.0)
    ap.add_argument("--name", default="grammar_compile")
    args = ap.parse_args()
    tok = Tokenizer.from_gguf(resolve_model_path(MODEL), ())
    vocab = len(tok.hf)
    inproc = GrammarBackend(tok.hf, vocab, (2,), compile_timeout=None)
    isolated = GrammarBackend(tok.hf, vocab, (2,), compile_timeout=args.deadline)
    inproc.compile(StructuredOutputs(regex="warm"))
    start = time.perf_counter()
    isolated.compile(StructuredOutputs(regex="warm"))
    child_start = time.perf_counter() - start
    rows = []
    for name, spec in CASES:
        rounds = 1 if "distinct" in name else args.rounds
        a = [timed(inproc, spec) for _ in range(rounds)] if "hostile" not in name else [None]
        b = [timed(isolated, spec) for _ in range(rounds)]
        row = {"schema": name, "chars": len(spec.key[1]),
               "in_process_s": None if None in a else statistics.median(a),
               "isolated_s": None if None in b else statistics.median(b),
               "grammar_mb": inproc._cache[spec.key].memory_size_bytes / 2**20 if spec.key in inproc._cache else None}
        rows.append(row)
        print(row, flush=True)
    isolated.close()
    env = environment()
    fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    table = [f"Grammar compile, first time ({env['cpu']}, {env['threads']} threads; median of {args.rounds}, "
             f"1 for the distinct-maxLength rows; deadline {args.deadline:g} s; child start {child_start:.2f} s "
             "once per engine and after each kill)", "",
             "| schema | chars | in-process s (no deadline) | child probe + in-process s (deadline) | compiled MB |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        iso = fmt(r["isolated_s"]) if r["isolated_s"] is not None else f"refused at {args.deadline:g} s"
        inp = fmt(r["in_process_s"]) if r["in_process_s"] is not None else "not run (~20 s)"
        table.append(f"| {r['schema']} | {r['chars']} | {inp} | {iso} | {fmt(r['grammar_mb'])} |")
    write_results(args.name, {"env": env, "deadline": args.deadline, "child_start_s": child_start, "rows": rows},
                  "\n".join(table))
    print("\n".join(table))


if __name__ == "__main__":
    main()
