"""The FP8 KV cache against the model's own cache (bf16 on a native-bf16 CPU), in one run.

    python -m benchmarks.kv_cache [--memory 1GiB] [--requests 32] [--prompt 4096] [--output 128]
                                  [--decode-batch 8] [--decode-context 2048] [--decode-steps 32] [--rounds 3]

1. Blocks at equal memory: the engine's own count for each cache in `--memory` (target >= 1.9x).
2. A long-context workload (`--requests` prompts of `--prompt` distinct tokens, `--output` generated
   each) through the real scheduler and block pool with the runner's outputs made by hand (the
   scheduler is tested that way too): a forward of 32 x 4k tokens on two cores takes many minutes
   and decides nothing about blocks. The largest batch whose whole sequences fit the blocks (none of
   them can then be preempted), and for the workload the largest batch that ran at once and the
   preemptions (the scheduler admits while a prompt's blocks are free and preempts when decodes run
   out: a peak above the bound is paid for in recomputed prompts).
3. Decode tok/s at long context: `--decode-batch` requests of `--decode-context`-token prompts,
   prefilled once per cache, then windows of `--decode-steps` decode steps timed on the engine's
   default CPU path (the C++ decode attention), the caches' windows interleaved, `--rounds` each
   after a first untimed one; the median.
4. Quality: the KV cache's gate (dataplane/quantize/gate.py, kv_fp8): perplexity on held-out text,
   teacher-forced greedy agreement and the token log-probabilities' difference (target: perplexity
   within 1%).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import environment, fmt, write_results
from dataplane import LLM, SamplingParams
from dataplane.config import SchedulerConfig, parse_bytes, resolve_dtype
from dataplane.kv_cache.manager import KVCacheManager
from dataplane.models.loader import load_model
from dataplane.quantize.gate import quality_gate
from dataplane.request import Request
from dataplane.scheduler.output import ModelRunnerOutput
from dataplane.scheduler.scheduler import Scheduler

MODEL = "smollm2-135m-instruct"
CACHES = ("auto", "fp8")


def run_workload(num_blocks: int, block_size: int, requests: int, prompt: int, output: int,
                 max_model_len: int, budget: int) -> dict:
    """`requests` long prompts at once through the scheduler: peak running batch, preemptions, steps."""
    config = SchedulerConfig(max_num_seqs=max(requests, 1), max_num_batched_tokens=budget)
    sched = Scheduler(config, KVCacheManager(num_blocks, block_size, True), max_model_len)
    for i in range(requests):  # distinct prompts: no prefix shared, every request needs its own blocks
        ids = [1000 + (i * prompt + t) % 40000 for t in range(prompt)]
        sched.add_request(Request(f"r{i}", ids, SamplingParams(max_tokens=output, ignore_eos=True), (2,)))
    peak = steps = 0
    while sched.requests:
        out = sched.schedule()
        result = ModelRunnerOutput()
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            if req.num_computed_tokens + n == req.num_tokens:
                result.sampled_token_ids[rid] = [7]
        sched.update(out, result)
        peak, steps = max(peak, len(sched.running)), steps + 1
        if steps > 10 * requests * (prompt // budget + output + 2):
            raise RuntimeError("the workload does not finish")
    pool = sched.kv.pool
    assert pool.num_free == pool.num_blocks, "blocks leaked"
    return {"requests": requests, "peak_running": peak, "preemptions": sched.num_preemptions, "steps": steps}


def prefill(llm: LLM, a: argparse.Namespace) -> float:
    """`decode_batch` prompts of `decode_context` tokens, prefilled (the same ids for both caches): seconds."""
    core = llm.core
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=(a.rounds + 1) * a.decode_steps + 4, temperature=0.0, ignore_eos=True)
    for i in range(a.decode_batch):
        ids = torch.randint(1000, 40000, (a.decode_context,), generator=gen).tolist()
        rid, text, children = core.make_requests(ids, params, request_id=f"d{i}")
        core.add(rid, text, children)
    t0 = time.perf_counter()
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()):
        core.step_core()
    return time.perf_counter() - t0


def decode_window(llm: LLM, a: argparse.Namespace) -> float:
    """`decode_steps` decode-only steps of the prefilled batch: tokens a second (the context grows by
    `decode_steps` a window, little against `decode_context`)."""
    t0 = time.perf_counter()
    for _ in range(a.decode_steps):
        llm.core.step_core()
    return a.decode_batch * a.decode_steps / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kv_cache", description=__doc__.splitlines()[0])
    p.add_argument("--memory", default="1GiB", help="kv_cache_memory of both engines")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt", type=int, default=4096)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens of the workload")
    p.add_argument("--decode-batch", type=int, default=8)
    p.add_argument("--decode-context", type=int, default=2048)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-quality", action="store_true", help="skip the gate's measures")
    p.add_argument("--name", default="kv_cache")
    a = p.parse_args()
    dtype = resolve_dtype("auto")
    loaded = load_model(MODEL, dtype, progress=False)
    max_len = min(loaded.args.max_position, a.prompt + a.output)
    engines = {c: LLM(MODEL, preloaded=loaded, dtype=str(dtype).removeprefix("torch."),
                      kv_cache_memory=a.memory, kv_cache_dtype=c, max_num_seqs=max(a.decode_batch, 8),
                      max_num_batched_tokens=a.budget) for c in CACHES}
    rows: dict[str, dict] = {}
    for c, llm in engines.items():
        m = llm.core.memory
        rows[c] = {"cache": m.kv_cache_dtype, "bytes_per_token": m.kv_bytes_per_token, "blocks": m.num_blocks,
                   "tokens": m.kv_cache_tokens,
                   "workload": run_workload(m.num_blocks, m.block_size, a.requests, a.prompt, a.output, max_len,
                                            a.budget),
                   "decode": []}
        per_request = -(-(a.prompt + a.output) // m.block_size)
        rows[c]["fits_whole"] = m.num_blocks // per_request
        print(f"{c}: {m.num_blocks} blocks, {rows[c]['fits_whole']} whole sequences, workload {rows[c]['workload']}",
              flush=True)
    for c, llm in engines.items():
        rows[c]["prefill_s"] = prefill(llm, a)
        decode_window(llm, a)  # a first window builds the shapes' kernels (oneDNN): not counted
        print(f"{c}: prefill {rows[c]['prefill_s']:.1f} s", flush=True)
    for r in range(a.rounds):  # interleaved windows, so a noisy neighbour hits both caches alike
        for c, llm in engines.items():
            rows[c]["decode"].append(decode_window(llm, a))
            print(f"window {r} {c}: {rows[c]['decode'][-1]:.1f} tok/s", flush=True)
    for c, llm in engines.items():
        while llm.core.has_unfinished():
            llm.core.step_core()
        assert llm.core.stats().num_free_blocks == llm.core.memory.num_blocks, f"{c}: blocks leaked"
        rows[c]["decode_tok_s"] = statistics.median(rows[c]["decode"])
    quality = None
    if not a.no_quality:
        report = quality_gate(MODEL, MODEL, kv_cache_dtype="fp8", dtype=str(dtype).removeprefix("torch."),
                              baseline_model=loaded)
        quality = report.to_dict()
    auto, fp8 = rows["auto"], rows["fp8"]
    data = {"environment": environment(), "model": MODEL, "dtype": str(dtype), "args": vars(a),
            "memory_bytes": parse_bytes(a.memory, name="memory"), "caches": rows, "quality": quality,
            "blocks_ratio": fp8["blocks"] / auto["blocks"],
            "decode_speedup": fp8["decode_tok_s"] / auto["decode_tok_s"]}
    env = data["environment"]
    lines = [
        f"# FP8 KV cache vs the {auto['cache']} cache (`python -m benchmarks.kv_cache`)", "",
        f"{MODEL}, {env['cpu']} ({env['cpu_capability']}), {env['threads']} threads, torch {env['torch']}, "
        f"{env['when']}. Both engines: kv_cache_memory {a.memory}, block size 16, the default CPU path.", "",
        "| | " + " | ".join(r["cache"] for r in rows.values()) + " | ratio |", "|---|---|---|---|",
        f"| bytes per token (30 layers, K and V) | {auto['bytes_per_token']} | {fp8['bytes_per_token']} | "
        f"{auto['bytes_per_token'] / fp8['bytes_per_token']:.2f}x less |",
        f"| blocks in {a.memory} (target >= 1.9x) | {auto['blocks']} | {fp8['blocks']} | {data['blocks_ratio']:.2f}x |",
        f"| {a.requests} x ({a.prompt} + {a.output}) tokens: sequences that fit whole (never preempted) | "
        f"{auto['fits_whole']} | {fp8['fits_whole']} | {fp8['fits_whole'] / max(auto['fits_whole'], 1):.2f}x |",
        f"| ... the workload: largest batch run at once / preemptions | {auto['workload']['peak_running']} / "
        f"{auto['workload']['preemptions']} | {fp8['workload']['peak_running']} / {fp8['workload']['preemptions']} | |",
        f"| decode tok/s, {a.decode_batch} x {a.decode_context}-token contexts (median of {a.rounds} windows) | "
        f"{fmt(auto['decode_tok_s'])} | {fmt(fp8['decode_tok_s'])} | {data['decode_speedup']:.2f}x |",
        f"| prefill of those {a.decode_batch} prompts, s | {fmt(auto['prefill_s'], 2)} | {fmt(fp8['prefill_s'], 2)} | "
        f"{fp8['prefill_s'] / auto['prefill_s']:.2f}x |",
    ]
    if quality:
        lines += [
            f"| perplexity, held-out text ({quality['eval_tokens']} tokens; target <= +1%) | "
            f"{quality['baseline_perplexity']:.3f} | {quality['candidate_perplexity']:.3f} | "
            f"{quality['perplexity_increase']:+.2%} |",
            f"| teacher-forced greedy agreement ({quality['agreement_tokens']} tokens) | – | "
            f"{quality['greedy_agreement']:.1%} | |",
            f"| token log-probability difference, mean / p99 (nats) | – | {quality['mean_logprob_delta']:.3f} / "
            f"{quality['p99_logprob_delta']:.3f} | |",
            "", f"Gate (kv_fp8): {'passed' if quality['passed'] else 'REFUSED'}: {quality['reason']}.",
        ]
    lines += ["", "The workload rows come from the scheduler and block pool with hand-made runner outputs (no model)."]
    table = "\n".join(lines)
    print(table)
    write_results(a.name, data, table)


if __name__ == "__main__":
    main()
