"""Engine throughput and latency against Hugging Face transformers, in one run, on the same requests.

    python -m benchmarks.engine [--quick]

Uniform: 32 requests of similar prompt length, 64 output tokens each (ignore_eos): this engine at
concurrency 1, 8 and 32; transformers `generate` one request at a time.
Mixed: 128 requests, prompt lengths log-uniform in 16..1024 and output lengths log-uniform in
16..256 (fixed seed), all submitted at once: this engine vs transformers static batching (batches
of 16, left-padded, each batch runs until its longest request is done; only each request's own
tokens count as useful).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass

import torch

from benchmarks.common import environment, fmt, measure_bandwidth_gbs, percentile, write_results
from dataplane import SamplingParams
from dataplane.config import CacheConfig, ModelConfig, SchedulerConfig, resolve_dtype
from dataplane.engine.core import EngineCore
from dataplane.models.loader import load_configured
from dataplane.models.registry import resolve_model_path

MODEL = "smollm2-135m-instruct"
WORDS = ("the of and to in is was for on that with as by at from his her an were which are this be "
         "data model cache engine token batch river mountain music garden science story city").split()


@dataclass
class Workload:
    prompts: list[list[int]]
    outputs: list[int]


def make_prompt(rng: random.Random, tokenizer, n_tokens: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids += tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(64)))
    return ids[:n_tokens]


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def uniform_workload(tokenizer, n: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    return Workload([make_prompt(rng, tokenizer, rng.randint(120, 136)) for _ in range(n)], [64] * n)


def mixed_workload(tokenizer, n: int, seed: int = 1) -> Workload:
    rng = random.Random(seed)
    return Workload([make_prompt(rng, tokenizer, log_uniform(rng, 16, 1024)) for _ in range(n)],
                    [log_uniform(rng, 16, 256) for _ in range(n)])


def run_engine(loaded, work: Workload, concurrency: int, mc: ModelConfig, batched_tokens: int = 512) -> dict:
    core = EngineCore(mc, CacheConfig(kv_cache_memory="2GiB"),
                      SchedulerConfig(max_num_seqs=concurrency, max_num_batched_tokens=batched_tokens),
                      progress=False, preloaded=loaded)
    warm = core.make_requests([1, 2, 3, 4], SamplingParams(max_tokens=4, temperature=0.0))
    core.add(*warm)
    while core.has_unfinished():
        core.step()
    start = time.perf_counter()
    token_times: dict[str, list[float]] = {}
    for i, (p, n) in enumerate(zip(work.prompts, work.outputs, strict=True)):
        rid, text, children = core.make_requests(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                                                 request_id=f"r{i}")
        core.add(rid, text, children)
        token_times[rid] = []
    steps = 0
    while core.has_unfinished():
        outs = core.step(delta=True)
        now = time.perf_counter()
        steps += 1
        for o in outs:
            token_times[o.request_id].extend([now] * sum(len(c.token_ids) for c in o.outputs))
    elapsed = time.perf_counter() - start
    ttft = [t[0] - start for t in token_times.values()]
    itl = [b - a for t in token_times.values() for a, b in zip(t, t[1:], strict=False)]
    tokens = sum(len(t) for t in token_times.values())
    return {"tokens": tokens, "seconds": elapsed, "tok_s": tokens / elapsed, "steps": steps,
            "ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3,
            "itl_p50_ms": (percentile(itl, 50) or 0) * 1e3, "itl_p99_ms": (percentile(itl, 99) or 0) * 1e3,
            "preemptions": core.stats().num_preemptions}


def load_transformers(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(MODEL)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.to(dtype).eval()


def run_hf_one_at_a_time(model, work: Workload, limit: int) -> dict:
    tokens = 0
    ttft = []
    start = time.perf_counter()
    with torch.inference_mode():
        for p, n in list(zip(work.prompts, work.outputs, strict=True))[:limit]:
            ids = torch.tensor([p])
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False)
            ttft.append(time.perf_counter() - t0)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
            tokens += out.shape[1] - ids.shape[1]
    elapsed = time.perf_counter() - start - sum(ttft)
    return {"tokens": tokens, "seconds": elapsed, "tok_s": tokens / elapsed, "requests": limit,
            "ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3}


def run_hf_static_batches(model, work: Workload, batch: int, limit: int) -> dict:
    useful = 0
    start = time.perf_counter()
    ttft = []
    pairs = list(zip(work.prompts, work.outputs, strict=True))[:limit]
    with torch.inference_mode():
        for b in range(0, len(pairs), batch):
            chunk = pairs[b : b + batch]
            width = max(len(p) for p, _ in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, (p, _) in enumerate(chunk):  # left padding, as generation needs
                ids[r, width - len(p):] = torch.tensor(p)
                mask[r, width - len(p):] = 1
            longest = max(n for _, n in chunk)
            batch_start = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, pad_token_id=0)
            done = time.perf_counter()
            # Static batching: every request in the batch returns when the batch does.
            ttft.extend([batch_start - start] * len(chunk))
            useful += sum(n for _, n in chunk)
            del done
    elapsed = time.perf_counter() - start
    return {"useful_tokens": useful, "seconds": elapsed, "tok_s": useful / elapsed, "requests": len(pairs),
            "queue_wait_p50_ms": percentile(ttft, 50) * 1e3}


def _uniform_rows(u: dict, hf_dtype: str) -> list[str]:
    rows = ["| workload | system | tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) |", "|---|---|---:|---:|---:|"]
    for c in (1, 8, 32):
        r = u[f"engine_c{c}"]
        rows.append(f"| uniform 32×(~128 in, 64 out) | tessera, concurrency {c} | {fmt(r['tok_s'])} | "
                    f"{fmt(r['ttft_p50_ms'], 0)} / {fmt(r['ttft_p99_ms'], 0)} | "
                    f"{fmt(r['itl_p50_ms'])} / {fmt(r['itl_p99_ms'])} |")
    r = u["transformers_one_at_a_time"]
    rows.append(f"| uniform | transformers {hf_dtype}, one at a time ({r['requests']} requests) | {fmt(r['tok_s'])} | "
                f"{fmt(r['ttft_p50_ms'], 0)} / {fmt(r['ttft_p99_ms'], 0)} | – |")
    return rows


def write_uniform_only(results: dict, args: argparse.Namespace, roofline: float, bandwidth: float,
                       weight_bytes: int) -> None:
    u = results["uniform"]
    results["ratios"] = {
        "uniform_c32_vs_transformers_one_at_a_time": u["engine_c32"]["tok_s"] / u["transformers_one_at_a_time"]["tok_s"],
        "batch1_fraction_of_roofline": u["engine_c1"]["tok_s"] / roofline,
    }
    ratios = results["ratios"]
    table = "\n".join(_uniform_rows(u, results["hf_dtype"])) + (
        f"\n\nUniform workload only (`--uniform-only`). Engine dtype {results['dtype']}, {torch.get_num_threads()} torch "
        f"thread(s). Uniform at 32 vs transformers one at a time: "
        f"**{ratios['uniform_c32_vs_transformers_one_at_a_time']:.1f}×** (target ≥ 10×). Batch-1 decode "
        f"{fmt(u['engine_c1']['tok_s'])} tok/s = **{ratios['batch1_fraction_of_roofline']:.0%}** of the "
        f"weight-bandwidth roofline ({bandwidth:.1f} GB/s measured / {weight_bytes / 1e6:.0f} MB of weights = "
        f"{roofline:.0f} tok/s).")
    print(table)
    write_results((args.name or "engine") + "_uniform" + ("-quick" if args.quick else ""), results, table)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run, not for the README)")
    ap.add_argument("--hf-uniform-requests", type=int, default=4, help="requests transformers runs one at a time")
    ap.add_argument("--mixed-requests", type=int, default=128)
    ap.add_argument("--uniform-only", action="store_true",
                    help="only the uniform workload (engine c1/c8/c32 and transformers one at a time, ~5 min; the "
                         "mixed workload's transformers static batches take over an hour here); writes engine_uniform.*")
    ap.add_argument("--dtype", default="bfloat16", help="the engine's; auto: what the worker picks on this host")
    ap.add_argument("--weight-dtype", default="auto", help="the engine's projection storage (ModelConfig.weight_dtype)")
    ap.add_argument("--hf-dtype", default="auto",
                    help="transformers' dtype; auto: bfloat16 where the CPU has it natively, else float32 (the "
                         "peer's faster choice on that host: emulated bf16 would flatter the ratio)")
    ap.add_argument("--name", default=None, help="results file stem (default engine / engine_uniform)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for both systems (default: torch's choice). On a shared, oversubscribed "
                         "machine 1 thread avoids OpenMP barrier stalls that make 2-thread timings meaningless")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.mixed_requests = 32
        args.hf_uniform_requests = 2

    bandwidth = measure_bandwidth_gbs()
    mc = ModelConfig(MODEL, dtype=args.dtype, weight_dtype=args.weight_dtype)
    loaded = load_configured(mc, progress=False)
    engine_dtype = mc.dtype_label
    hf_dtype = resolve_dtype(args.hf_dtype)
    hf_name = str(hf_dtype).removeprefix("torch.")
    tok = loaded.tokenizer
    weight_bytes = loaded.model.weight_bytes
    roofline = bandwidth * 1e9 / weight_bytes
    results: dict = {"env": environment(), "dtype": engine_dtype, "hf_dtype": hf_name, "bandwidth_gbs": bandwidth,
                     "weight_bytes": weight_bytes, "batch1_roofline_tok_s": roofline, "uniform": {}, "mixed": {}}

    uni = uniform_workload(tok, 8 if args.quick else 32)
    for c in (1, 8, 32):
        w = Workload(uni.prompts[: max(c, 8 if c == 1 else c)], uni.outputs[: max(c, 8 if c == 1 else c)]) \
            if c == 1 else uni
        results["uniform"][f"engine_c{c}"] = run_engine(loaded, w, c, mc)
        print(f"uniform engine c={c}: {results['uniform'][f'engine_c{c}']['tok_s']:.1f} tok/s", flush=True)
    hf = load_transformers(hf_dtype)
    results["uniform"]["transformers_one_at_a_time"] = run_hf_one_at_a_time(hf, uni, args.hf_uniform_requests)
    print(f"uniform transformers: {results['uniform']['transformers_one_at_a_time']['tok_s']:.1f} tok/s", flush=True)
    if args.uniform_only:
        write_uniform_only(results, args, roofline, bandwidth, weight_bytes)
        return

    mixed = mixed_workload(tok, args.mixed_requests)
    results["mixed"]["engine"] = run_engine(loaded, mixed, 64, mc)
    print(f"mixed engine: {results['mixed']['engine']['tok_s']:.1f} tok/s", flush=True)
    results["mixed"]["transformers_static_16"] = run_hf_static_batches(hf, mixed, 16, args.mixed_requests)
    print(f"mixed transformers: {results['mixed']['transformers_static_16']['tok_s']:.1f} tok/s", flush=True)

    u, m = results["uniform"], results["mixed"]
    hf1 = u["transformers_one_at_a_time"]["tok_s"]
    results["ratios"] = {
        "uniform_c32_vs_transformers_one_at_a_time": u["engine_c32"]["tok_s"] / hf1,
        "mixed_vs_transformers_static": m["engine"]["tok_s"] / m["transformers_static_16"]["tok_s"],
        "batch1_fraction_of_roofline": u["engine_c1"]["tok_s"] / roofline,
    }
    rows = _uniform_rows(u, hf_name)
    r = m["engine"]
    rows.append(f"| mixed {args.mixed_requests} (16–1024 in, 16–256 out) | tessera, all at once | {fmt(r['tok_s'])} | "
                f"{fmt(r['ttft_p50_ms'], 0)} / {fmt(r['ttft_p99_ms'], 0)} | "
                f"{fmt(r['itl_p50_ms'])} / {fmt(r['itl_p99_ms'])} |")
    r = m["transformers_static_16"]
    rows.append(f"| mixed | transformers {hf_name}, static batches of 16 (useful tokens) | {fmt(r['tok_s'])} | "
                f"wait p50 {fmt(r['queue_wait_p50_ms'], 0)} | – |")
    ratios = results["ratios"]
    table = "\n".join(rows) + (
        f"\n\nEngine dtype {engine_dtype}, {torch.get_num_threads()} torch thread(s). Uniform at 32 vs transformers one at a time: "
        f"**{ratios['uniform_c32_vs_transformers_one_at_a_time']:.1f}×** (target ≥ 10×). "
        f"Mixed vs static batching: **{ratios['mixed_vs_transformers_static']:.2f}×** (target ≥ 2×). "
        f"Batch-1 decode {fmt(u['engine_c1']['tok_s'])} tok/s = **{ratios['batch1_fraction_of_roofline']:.0%}** of the "
        f"weight-bandwidth roofline ({bandwidth:.1f} GB/s measured / {weight_bytes / 1e6:.0f} MB of weights = "
        f"{roofline:.0f} tok/s; target ≥ 60%).")
    print(table)
    write_results((args.name or "engine") + ("-quick" if args.quick else ""), results, table)


if __name__ == "__main__":
    main()
