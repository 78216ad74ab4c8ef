"""Decode speed, weight memory and quality of bf16, FP8 and AWQ int4 SmolLM2 on this CPU.

    python -m benchmarks.quant [--awq DIR] [--awq-qk DIR] [--fp8 DIR] [--rounds 5] [--steps 24]

Each variant is a real engine (EngineCore) on its own loaded weights. Decode tokens/s at batch 1
and batch 32: all prompts (64 tokens each) prefill in one step, then `steps` pure decode steps
are timed with process_time (CPU time of this process: the two cores are shared, and waiting
for another user's process is not our cost); TESSERA_BENCH_THREADS threads (default 1, see
docs/kernels.md). Variants are measured interleaved, round after round, and the median is
reported, so drift on the machine hits them all alike. Perplexity on the held-out
dataplane/quantize/data/eval.txt and teacher-forced greedy agreement with bf16 come from the quality
gate's functions; the gate's verdict with default thresholds is printed beside each.

Without --awq / --awq-qk / --fp8 the checkpoints are made with `python -m dataplane.quantize`'s
defaults (AWQ: group 32; the second keeps q_proj and k_proj in fp16) into ~/.cache/tessera/quant
(minutes for each AWQ, once). Writes benchmarks/results/quant.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import environment, fmt, write_results
from dataplane import SamplingParams
from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig
from dataplane.engine.core import EngineCore
from dataplane.models.disk_cache import cache_dir
from dataplane.models.loader import LoadedModel, load_model
from dataplane.quantize.eval import greedy_agreement, greedy_continuations, perplexity
from dataplane.quantize.gate import EVAL_TEXT, PROMPTS, thresholds_for

MODEL = "smollm2-135m-instruct"
PROMPT_LEN = 64
THREADS = int(os.environ.get("TESSERA_BENCH_THREADS", "1"))


def checkpoint(method: str, given: str | None, **options: object) -> Path:
    """`given`, or a checkpoint made once with the CLI's defaults plus `options` and cached."""
    if given:
        return Path(given)
    tag = "-".join(f"{k}={'+'.join(v) if isinstance(v, tuple) else v}" for k, v in sorted(options.items()))
    out = cache_dir("quant") / f"{MODEL}-{method}{'-' + tag if tag else ''}"
    if not (out / "config.json").exists():
        from dataplane.quantize.make import quantize

        print(f"quantizing {MODEL} with {method} {options} into {out} (once)")
        quantize(method, MODEL, out, **options)  # type: ignore[arg-type]
    return out


def make_core(loaded: LoadedModel, batch: int) -> EngineCore:
    return EngineCore(ModelConfig(MODEL), CacheConfig(kv_cache_memory="512MiB"),
                      SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=batch * PROMPT_LEN),
                      progress=False, preloaded=loaded)


def decode_tokens_per_s(core: EngineCore, batch: int, steps: int, seed: int) -> float:
    """One prefill step for `batch` prompts, then `steps` timed decode steps of the whole batch."""
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        prompt = torch.randint(100, 40000, (PROMPT_LEN,), generator=g).tolist()
        core.add(*core.make_requests(prompt, params, request_id=f"s{seed}-{i}"))
    core.step()  # every prompt prefills and samples its first token
    t0 = time.process_time()
    for _ in range(steps):
        core.step()
    elapsed = time.process_time() - t0
    while core.has_unfinished():
        core.step()
    return batch * steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--awq", help="AWQ checkpoint, all projections int4 (default: group 32, made once, cached)")
    parser.add_argument("--awq-qk", help="AWQ checkpoint with q/k kept fp16 (default: group 32, made once, cached)")
    parser.add_argument("--fp8", help="FP8 checkpoint directory (default: made once, cached)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24, help="timed decode steps per measurement")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    fp8 = checkpoint("fp8", args.fp8)
    awq = checkpoint("awq", args.awq, group_size=32)
    awq_qk = checkpoint("awq", args.awq_qk, group_size=32, keep_dense=("q_proj", "k_proj"))
    variants = {  # name -> (loader kwargs, gate method)
        "bf16": ({"name": MODEL}, None),
        "fp8 (e4m3, decoded to bf16 at load on CPU)": ({"name": str(fp8)}, "fp8"),
        "awq int4 g32": ({"name": str(awq)}, "awq"),
        "awq int4 g32, q/k fp16": ({"name": str(awq_qk)}, "awq"),
        "awq int4 g32, q/k fp16, int8 lm head": ({"name": str(awq_qk), "quantize_lm_head": True}, "awq"),
        "awq int4 g32, q/k fp16, bf16 copy > 8 rows": ({"name": str(awq_qk), "int4_dense_above": 8}, "awq"),
    }
    models = {v: load_model(kw.pop("name"), torch.bfloat16, progress=False, **kw) for v, (kw, _) in variants.items()}
    base = models["bf16"]
    ids = base.tokenizer.hf(EVAL_TEXT.read_text(), add_special_tokens=False).input_ids
    prompt_ids = [base.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    refs = greedy_continuations(base, prompt_ids, 32)
    rows: dict[str, dict] = {}
    for name, lm in models.items():
        ppl = perplexity(lm.model, ids)
        rows[name] = {"weight_bytes": lm.model.weight_bytes, "perplexity": ppl,
                      "greedy_agreement": greedy_agreement(lm.model, prompt_ids, refs), "b1": [], "b32": []}
    base_ppl = rows["bf16"]["perplexity"]
    for name, (_, method) in variants.items():
        r = rows[name]
        r["perplexity_increase"] = r["perplexity"] / base_ppl - 1
        if method:
            t = thresholds_for(method)
            r["gate_passed"] = (r["perplexity_increase"] <= t.max_perplexity_increase
                                and r["greedy_agreement"] >= t.min_greedy_agreement)
    cores = {name: (make_core(lm, 1), make_core(lm, 32)) for name, lm in models.items()}
    for c1, c32 in cores.values():  # warm-up
        decode_tokens_per_s(c1, 1, 4, 0)
        decode_tokens_per_s(c32, 32, 2, 0)
    for rnd in range(args.rounds):
        for name, (c1, c32) in cores.items():
            rows[name]["b1"].append(decode_tokens_per_s(c1, 1, args.steps, rnd + 1))
            rows[name]["b32"].append(decode_tokens_per_s(c32, 32, max(4, args.steps // 3), rnd + 1))
        print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(f"{n}: {statistics.median(r['b1']):.1f}"
                                                            for n, r in rows.items()))
    b1_base = statistics.median(rows["bf16"]["b1"])
    b32_base = statistics.median(rows["bf16"]["b32"])
    lines = ["| variant | weights MiB | batch-1 tok/s | vs bf16 | batch-32 tok/s | vs bf16 | perplexity | "
             "Δ ppl | greedy agreement | gate |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        r["b1_median"], r["b32_median"] = statistics.median(r["b1"]), statistics.median(r["b32"])
        gate = "–" if "gate_passed" not in r else ("pass" if r["gate_passed"] else "refused")
        lines.append(f"| {name} | {r['weight_bytes'] / 2**20:.0f} | {fmt(r['b1_median'])} | "
                     f"{r['b1_median'] / b1_base:.2f}x | {fmt(r['b32_median'])} | {r['b32_median'] / b32_base:.2f}x | "
                     f"{r['perplexity']:.3f} | {r['perplexity_increase']:+.2%} | {r['greedy_agreement']:.1%} | {gate} |")
    table = "\n".join(lines)
    note = (f"\n\nSmolLM2-135M-Instruct, bf16 activations, {THREADS} thread(s), process CPU time, median of "
            f"{args.rounds} interleaved rounds; {args.steps} decode steps at batch 1, {max(4, args.steps // 3)} at "
            f"batch 32, {PROMPT_LEN}-token prompts. Perplexity over {len(ids)} held-out tokens; agreement over "
            f"{sum(map(len, refs))} bf16 greedy tokens. Weights include the bf16 embedding (and the head it ties).")
    print(table + note)
    write_results("quant", {"environment": environment(), "awq": str(awq), "awq_qk": str(awq_qk), "fp8": str(fp8),
                            "rows": rows},
                  "# Quantized decode on the CPU (python -m benchmarks.quant)\n\n" + table + note)


if __name__ == "__main__":
    main()
