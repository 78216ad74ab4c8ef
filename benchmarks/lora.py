"""Multi-LoRA throughput: one batch mixing 8 adapters vs the base model alone vs one adapter at a time.

    python -m benchmarks.lora [--rounds 3] [--rank 16] [--targets all|attn] [--dtype bfloat16]

Workload: 32 requests (prompts of ~128 tokens, 64 output tokens each, ignore_eos), 4 per adapter
over 8 adapters (PEFT format on disk, random non-zero weights).

- base: the 32 requests on an engine without LoRA.
- mixed: the 32 requests, each with its adapter, submitted together (max_loras=8).
- swapping: one adapter at a time, as a replica per fine-tune would: load the adapter from disk,
  serve its 4 requests as one batch, unload it; the loads count in the time.

The machine is shared and noisy, so the three variants run interleaved in rounds in one process
and the report gives per-round ratios (and their median) as well as tokens per second. A first
full round is run and not reported (`--warmup-rounds`): it was consistently the slowest for every
variant (base 218 against 335 tok/s later in one run), the one-time cost of new shapes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from benchmarks.common import environment, fmt, percentile, write_results
from dataplane import SamplingParams
from dataplane.config import LORA_TARGET_MODULES, CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig
from dataplane.engine.core import EngineCore
from dataplane.lora.adapter import MODULE_GROUP, group_shapes
from dataplane.models.loader import load_configured

MODEL = "smollm2-135m-instruct"
NUM_ADAPTERS = 8
PER_ADAPTER = 4
OUTPUT_TOKENS = 64
WORDS = ("the of and to in is was for on that with as by at from his her an were which are this be "
         "data model cache engine token batch river mountain music garden science story city").split()
TARGETS = {"all": LORA_TARGET_MODULES, "attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "qv": ("q_proj", "v_proj")}


def write_peft_adapter(path: Path, args, rank: int, targets: tuple[str, ...], seed: int) -> None:
    """A PEFT-format adapter (what `save_pretrained` writes) with random non-zero A and B."""
    gen = torch.Generator().manual_seed(seed)
    shapes = group_shapes(args)
    tensors = {}
    for layer in range(args.num_layers):
        for module in targets:
            group, sub = MODULE_GROUP[module]
            part = "mlp" if group in ("gate_up", "down") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            fan_in, fan_out = shapes[group].in_features, shapes[group].out_features[sub]
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 0.01
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(targets),
        "bias": "none", "use_rslora": False, "base_model_name_or_path": MODEL}))


def make_prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        ids: list[int] = []
        length = rng.randint(120, 136)
        while len(ids) < length:
            ids += tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(64)))
        prompts.append(ids[:length])
    return prompts


def engine(loaded, mc: ModelConfig, lora: LoRAConfig | None) -> EngineCore:
    return EngineCore(mc, CacheConfig(kv_cache_memory="512MiB"),
                      SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=512), progress=False,
                      preloaded=loaded, lora_config=lora)


def run_batch(core: EngineCore, prompts: list[list[int]], adapters: list[str | None]) -> tuple[int, list[float]]:
    """Submit all, run to completion; returns (output tokens, step times)."""
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
    for p, a in zip(prompts, adapters, strict=True):
        core.add(*core.make_requests(p, params, adapter=a))
    tokens, steps = 0, []
    while core.has_unfinished():
        t0 = time.perf_counter()
        outs = core.step(delta=True)
        steps.append(time.perf_counter() - t0)
        tokens += sum(len(c.token_ids) for o in outs for c in o.outputs)
    return tokens, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup-rounds", type=int, default=1,
                    help="full rounds run first and not reported: the first pass over each shape pays one-time "
                         "costs (oneDNN kernels built per shape, first-touch memory) that a serving worker pays once")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", choices=sorted(TARGETS), default="all")
    ap.add_argument("--dtype", default="bfloat16", help="auto: what the worker would pick on this host")
    ap.add_argument("--weight-dtype", default="auto", help="dense projections' storage (ModelConfig.weight_dtype)")
    ap.add_argument("--name", default="lora", help="results file name (benchmarks/results/<name>.json/.md)")
    args = ap.parse_args()

    mc = ModelConfig(MODEL, dtype=args.dtype, weight_dtype=args.weight_dtype)
    loaded = load_configured(mc, progress=False)
    dtype = mc.dtype_label
    tmp = Path(tempfile.mkdtemp(prefix="tessera-lora-bench-"))
    names = [f"tenant-{i}" for i in range(NUM_ADAPTERS)]
    for i, name in enumerate(names):
        write_peft_adapter(tmp / name, loaded.args, args.rank, TARGETS[args.targets], seed=i)
    prompts = make_prompts(loaded.tokenizer, NUM_ADAPTERS * PER_ADAPTER)
    assignment = [names[i % NUM_ADAPTERS] for i in range(len(prompts))]

    base = engine(loaded, mc, None)
    mixed = engine(loaded, mc, LoRAConfig(max_loras=NUM_ADAPTERS, max_lora_rank=args.rank))
    swap = engine(loaded, mc, LoRAConfig(max_loras=1, max_lora_rank=args.rank))
    for name in names:
        mixed.add_adapter(name, str(tmp / name))
    # Warm-up: first steps allocate buffers and fill caches; every adapter is copied into its slot
    # once (steady-state serving), so round 0 measures serving, not slot loading.
    run_batch(base, prompts[:NUM_ADAPTERS], [None] * NUM_ADAPTERS)
    run_batch(mixed, prompts[:NUM_ADAPTERS], names)
    swap.add_adapter(names[0], str(tmp / names[0]))
    run_batch(swap, prompts[:1], names[:1])
    swap.remove_adapter(names[0])

    rounds = []
    for r in range(-args.warmup_rounds, args.rounds):
        row = {}
        t0 = time.perf_counter()
        tokens, steps = run_batch(base, prompts, [None] * len(prompts))
        row["base"] = {"tokens": tokens, "seconds": time.perf_counter() - t0, "step_ms_p50": percentile(steps, 50) * 1e3}
        t0 = time.perf_counter()
        tokens, steps = run_batch(mixed, prompts, assignment)
        row["mixed"] = {"tokens": tokens, "seconds": time.perf_counter() - t0,
                        "step_ms_p50": percentile(steps, 50) * 1e3}
        t0 = time.perf_counter()
        tokens, load_s, steps = 0, 0.0, []
        for name in names:
            tl = time.perf_counter()
            swap.add_adapter(name, str(tmp / name))
            load_s += time.perf_counter() - tl
            own = [i for i, a in enumerate(assignment) if a == name]
            n, s = run_batch(swap, [prompts[i] for i in own], [name] * len(own))
            tokens += n
            steps += s
            swap.remove_adapter(name)
        row["swapping"] = {"tokens": tokens, "seconds": time.perf_counter() - t0, "adapter_load_seconds": load_s,
                           "step_ms_p50": percentile(steps, 50) * 1e3}
        for v in row.values():
            v["tok_s"] = v["tokens"] / v["seconds"]
        row["mixed_vs_base"] = row["mixed"]["tok_s"] / row["base"]["tok_s"]
        row["mixed_vs_swapping"] = row["mixed"]["tok_s"] / row["swapping"]["tok_s"]
        if r >= 0:
            rounds.append(row)
        print(f"{'warm-up round' if r < 0 else 'round'} {r}: base {row['base']['tok_s']:.1f} tok/s, mixed {row['mixed']['tok_s']:.1f}, "
              f"swapping {row['swapping']['tok_s']:.1f}; mixed/base {row['mixed_vs_base']:.2f}, "
              f"mixed/swapping {row['mixed_vs_swapping']:.2f}", flush=True)

    med = {k: statistics.median(r[k] for r in rounds) for k in ("mixed_vs_base", "mixed_vs_swapping")}
    tok_s = {v: statistics.median(r[v]["tok_s"] for r in rounds) for v in ("base", "mixed", "swapping")}
    slots = mixed.runner.lora.slots
    results = {
        "env": environment(), "dtype": dtype, "rank": args.rank, "targets": list(TARGETS[args.targets]),
        "warmup_rounds": args.warmup_rounds,
        "adapters": NUM_ADAPTERS, "requests": len(prompts), "output_tokens": OUTPUT_TOKENS,
        "slot_buffer_mib": slots.num_bytes / 2**20, "rounds": rounds, "median_ratios": med, "median_tok_s": tok_s,
        "targets_met": {"mixed_ge_80pct_base": med["mixed_vs_base"] >= 0.8,
                        "mixed_ge_3x_swapping": med["mixed_vs_swapping"] >= 3.0},
    }
    table = [
        f"# Multi-LoRA throughput ({dtype}, rank {args.rank}, targets {args.targets}, "
        f"{NUM_ADAPTERS} adapters x {PER_ADAPTER} requests, {OUTPUT_TOKENS} output tokens each)", "",
        "| round | base tok/s | mixed tok/s | swapping tok/s | mixed / base | mixed / swapping |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rounds):
        table.append(f"| {i} | {fmt(r['base']['tok_s'])} | {fmt(r['mixed']['tok_s'])} | {fmt(r['swapping']['tok_s'])} "
                     f"| {r['mixed_vs_base']:.2f} | {r['mixed_vs_swapping']:.2f} |")
    table.append(f"| median | {fmt(tok_s['base'])} | {fmt(tok_s['mixed'])} | {fmt(tok_s['swapping'])} | "
                 f"{med['mixed_vs_base']:.2f} | {med['mixed_vs_swapping']:.2f} |")
    table += ["", f"Targets: mixed >= 0.80 x base: {'met' if med['mixed_vs_base'] >= 0.8 else 'NOT met'}; "
              f"mixed >= 3 x swapping: {'met' if med['mixed_vs_swapping'] >= 3 else 'NOT met'}. "
              f"Slot buffers: {results['slot_buffer_mib']:.0f} MiB. {args.warmup_rounds} warm-up round(s) not shown. "
              f"Environment: {results['env']}."]
    jpath, mpath = write_results(args.name, results, "\n".join(table))
    print("\n".join(table))
    print(f"wrote {jpath} and {mpath}")


if __name__ == "__main__":
    main()
