"""The prefix cache's second tier on a multi-turn agent workload: TTFT and prefill tokens computed, without a
second tier, with one in host memory and with one in a local directory, in one run.

    python -m benchmarks.kv_offload [--conversations 16] [--turns 8] [--history 2048] [--turn-tokens 64]
                                    [--output 16] [--cache-tokens 8192] [--dtype bfloat16]

Each conversation starts from its own `--history`-token context (distinct token ids: no prefix shared across
conversations), and each turn adds `--turn-tokens` user tokens and `--output` assistant tokens to it. The
conversations take turns round-robin, one request at a time (an agent waits for its answer), so every
request's TTFT is its own prefill, with no queueing. The KV cache holds `--cache-tokens` tokens, fewer than the
conversations' histories together: without a second tier a returning turn finds its history evicted and
recomputes it; with one its blocks come back from the tier. The assistant's tokens appended to a history are
fixed in advance (not the model's sampled ones), so every configuration sees the same prompts.

Reported per configuration: TTFT p50/p95 of first turns and of returning turns, prompt tokens computed, the
tier's blocks loaded and the time spent loading them, the wall time. Target: returning turns' TTFT p95 with the
tier <= 0.5x without it.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from benchmarks.common import environment, fmt, percentile, write_results
from dataplane import LLM, SamplingParams
from dataplane.config import resolve_dtype
from dataplane.models.loader import load_model
from dataplane.runner.model_runner import ModelRunner

MODEL = "smollm2-135m-instruct"


def conversations(a: argparse.Namespace, vocab: int) -> list[list[list[int]]]:
    """Per conversation, per turn, the tokens that turn adds (the first turn: the history and a question)."""
    rng = random.Random(a.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, vocab - 1) for _ in range(n)]

    return [[tokens(a.history + a.turn_tokens)] + [tokens(a.output + a.turn_tokens) for _ in range(a.turns - 1)]
            for _ in range(a.conversations)]


def run(llm: LLM, convs: list[list[list[int]]], a: argparse.Namespace) -> dict:
    params = SamplingParams(max_tokens=a.output, temperature=0.0, ignore_eos=True)
    histories: list[list[int]] = [[] for _ in convs]
    first, returning, computed = [], [], 0
    t0 = time.perf_counter()
    for turn in range(a.turns):
        for c, conv in enumerate(convs):
            histories[c] += conv[turn]
            (out,) = llm.generate([list(histories[c])], params)
            (first if turn == 0 else returning).append(out.metrics.ttft * 1000)
            computed += len(histories[c]) - out.num_cached_tokens
    wall = time.perf_counter() - t0
    tier = llm.core.stats().kv_offload
    return {"first_p50_ms": percentile(first, 50), "first_p95_ms": percentile(first, 95),
            "returning_p50_ms": percentile(returning, 50), "returning_p95_ms": percentile(returning, 95),
            "prompt_tokens_computed": computed, "wall_s": wall,
            "loaded_blocks": tier.loaded_blocks if tier else 0, "loaded_bytes": tier.loaded_bytes if tier else 0,
            "load_s": tier.load_seconds if tier else 0.0, "saved_blocks": tier.saved_blocks if tier else 0,
            "failed_loads": tier.failed_loads if tier else 0}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kv_offload", description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--history", type=int, default=2048, help="tokens of each conversation's starting context")
    p.add_argument("--turn-tokens", type=int, default=64, help="user tokens each turn adds")
    p.add_argument("--output", type=int, default=16, help="tokens generated each turn")
    p.add_argument("--cache-tokens", type=int, default=8192, help="the KV cache's (first tier's) size in tokens")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="kv_offload")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = resolve_dtype(a.dtype)
    loaded = load_model(MODEL, dtype, progress=False)
    per_token = ModelRunner.kv_bytes_per_token(loaded.model)
    convs = conversations(a, loaded.args.vocab_size)
    total_tokens = a.conversations * (a.history + a.turns * (a.turn_tokens + a.output))
    cache = a.cache_tokens * per_token
    offload = int(total_tokens * per_token * 1.25)  # room for every history: the tier is not the limit here
    common = {"dtype": a.dtype, "preloaded": loaded, "kv_cache_memory": cache, "block_size": a.block_size,
              "max_num_batched_tokens": 512, "max_model_len": a.history + a.turns * (a.turn_tokens + a.output) + 64}
    results = {}
    with tempfile.TemporaryDirectory(prefix="kv-offload-") as directory:
        configs = {"no second tier": {}, "second tier, host memory": {"kv_offload_size": offload},
                   "second tier, local directory": {"kv_offload_size": offload, "kv_offload_dir": directory}}
        for name, extra in configs.items():
            llm = LLM(MODEL, **common, **extra)
            llm.generate(["warm up"], SamplingParams(max_tokens=2))
            results[name] = run(llm, convs, a)
            llm.core.close()
            print(name, {k: round(v, 1) if isinstance(v, float) else v for k, v in results[name].items()}, flush=True)
    base = results["no second tier"]
    data = {"environment": environment(), "model": MODEL, "args": {k: v for k, v in vars(a).items()},
            "kv_bytes_per_token": per_token, "cache_bytes": cache, "offload_bytes": offload,
            "workload_tokens": total_tokens, "results": results}
    env = data["environment"]
    lines = ["# The prefix cache's second tier on a multi-turn agent workload (`python -m benchmarks.kv_offload`)", "",
             f"{MODEL} ({a.dtype}), {env['cpu']} ({env['cpu_capability']}), {env['threads']} threads, torch "
             f"{env['torch']}, {env['when']}. {a.conversations} conversations x {a.turns} turns, round-robin, one "
             f"request at a time: a {a.history}-token starting context each, +{a.turn_tokens} user and "
             f"+{a.output} assistant tokens a turn ({total_tokens} tokens of histories at the end). KV cache: "
             f"{a.cache_tokens} tokens ({cache / 2**20:.0f} MiB); second tier: {offload / 2**20:.0f} MiB.", "",
             "| | first turns TTFT p50 / p95, ms | returning turns TTFT p50 / p95, ms | returning p95 vs none "
             "(target <= 0.5x) | prompt tokens computed | blocks loaded (ms each) | wall, s |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = (r["returning_p95_ms"] / base["returning_p95_ms"]) if base["returning_p95_ms"] else None
        per_block = (r["load_s"] * 1000 / r["loaded_blocks"]) if r["loaded_blocks"] else None
        lines.append(f"| {name} | {fmt(r['first_p50_ms'], 0)} / {fmt(r['first_p95_ms'], 0)} | "
                     f"{fmt(r['returning_p50_ms'], 0)} / {fmt(r['returning_p95_ms'], 0)} | "
                     f"{fmt(ratio, 2)}x | {r['prompt_tokens_computed']} | "
                     f"{r['loaded_blocks']} ({fmt(per_block, 2)}) | {fmt(r['wall_s'], 1)} |")
    lines += ["", "Load time is reading and verifying (CRC-32) the blocks on the scheduler's thread; the copy into "
              "the KV cache runs in the step. Saves are written on a thread while the next steps run."]
    table = "\n".join(lines)
    write_results(a.name, data, table)
    print(table)


if __name__ == "__main__":
    main()
