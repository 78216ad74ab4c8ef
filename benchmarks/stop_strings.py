"""Stop strings: the per-token scan on the engine thread, naive find() per string vs the automaton.

    python -m benchmarks.stop_strings [--rounds 5] [--name stop_strings]

Each case streams the same English-like text (4 characters per token) through both scans with stop
strings that never match (the common case, and the worst: every token is scanned to the end):
- naive (the peer, the detokenizer before this change): `str.find` per stop string from the
  held-back tail (longest stop - 1 characters) on every token;
- automaton (dataplane/engine/stop_strings.py): Aho–Corasick fed only the new characters.
Counts beyond 4 cannot be sent any more (SamplingParams caps stop at 4 strings of 256 characters);
they show what the caps protect against and that the automaton's cost does not depend on them.
Per-token time is the median over rounds; the automaton's one-off build (cached per stop list) is
listed apart. Writes benchmarks/results/<name>.json and .md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.common import environment, write_results
from dataplane.engine.stop_strings import StopMatcher, _automaton, find_stop_naive

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will more can out about "
         "model answer question token stream engine request tenant worker").split()
# (count, length of each stop string): the caps' corner, real uses, and what used to be accepted.
CASES = [(1, 8), (4, 8), (4, 256), (16, 8), (256, 8), (4096, 8), (100_000, 8)]


def make_text(rng: random.Random, chars: int) -> list[str]:
    words = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS))
    text = " ".join(words)
    return [text[i:i + 4] for i in range(0, len(text), 4)]


def make_stops(rng: random.Random, count: int, length: int, tokens: list[str]) -> list[str]:
    text = "".join(tokens)
    stops: list[str] = []
    while len(stops) < count:
        s = "".join(rng.choice("etaoinshrdlu ") for _ in range(length))
        if s not in text:  # never matches: every token is scanned in full
            stops.append(s)
    return stops


def naive_per_token(tokens: list[str], stops: list[str]) -> float:
    holdback = max(map(len, stops)) - 1
    text = ""
    start = time.perf_counter()
    for piece in tokens:
        search_from = max(0, len(text) - holdback)
        text += piece
        assert find_stop_naive(text, stops, search_from) is None
    return (time.perf_counter() - start) / len(tokens)


def automaton_per_token(tokens: list[str], stops: list[str]) -> float:
    matcher = StopMatcher(stops)  # built before the clock starts (cached per stop list)
    text = ""
    start = time.perf_counter()
    for piece in tokens:
        text += piece
        assert matcher.feed(piece) is None
    return (time.perf_counter() - start) / len(tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per request (fewer for huge naive cases)")
    ap.add_argument("--name", default="stop_strings")
    args = ap.parse_args()
    rng = random.Random(0)
    tokens_all = make_text(rng, args.tokens * 4)[: args.tokens]
    rows = []
    for count, length in CASES:
        stops = make_stops(rng, count, length, tokens_all)
        # The naive scan at 100k strings takes ~25 ms a token: fewer tokens keep the run short.
        tokens = tokens_all[: max(16, min(args.tokens, 2_000_000 // (count * 4)))]
        _automaton.cache_clear()
        t0 = time.perf_counter()
        StopMatcher(stops)
        build = time.perf_counter() - t0
        naive, auto = [], []
        for _ in range(args.rounds):  # interleaved, so drift in a shared CPU hits both alike
            naive.append(naive_per_token(tokens, stops))
            auto.append(automaton_per_token(tokens, stops))
        row = {"count": count, "length": length, "tokens": len(tokens),
               "naive_us_per_token": statistics.median(naive) * 1e6,
               "automaton_us_per_token": statistics.median(auto) * 1e6, "automaton_build_ms": build * 1e3}
        rows.append(row)
        print(row, flush=True)
    env = environment()
    table = [f"Stop-string scan per token ({env['cpu']}, Python {env['python']}; median of {args.rounds} rounds; "
             "stop strings that never match, 4-character tokens)", "",
             "| stop strings | chars each | naive find() µs/token | automaton µs/token | automaton build ms (once per list) |",
             "|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['count']} | {r['length']} | {r['naive_us_per_token']:.2f} | "
                     f"{r['automaton_us_per_token']:.2f} | {r['automaton_build_ms']:.2f} |")
    write_results(args.name, {"env": env, "rounds": args.rounds, "rows": rows}, "\n".join(table))
    print("\n".join(table))


if __name__ == "__main__":
    main()
