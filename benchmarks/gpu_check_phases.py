"""The GPU check's phases (benchmarks/gpu_check.py runs them in order, each in its budget) and the
roofline assembled from what they measured. Each phase takes (Context, Budget, the run's record),
writes what it measures into the record as it goes, and returns its section."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.gpu_compare import TOLERANCES, compare_outputs, vars_of
from benchmarks.gpu_phases import Budget
from benchmarks.gpu_plan import PROMPTS, Context, Plan, resolve


def phase_setup(ctx: Context, budget: Budget, record: dict) -> dict:
    from benchmarks.roofline import measure_ceilings

    plan = ctx.plan
    ctx.ceilings = measure_ceilings(plan.device)
    c = ctx.ceilings
    print(f"   ceilings: {c.bandwidth / 1e12:.2f} TB/s copy, {c.peak_flops / 1e12:.1f} TFLOP/s {c.dtype}", flush=True)
    ctx.speed()
    record["speed_model"] = ctx.speed_model
    return {"ceilings": asdict(c)}


def phase_graphs_vs_eager(ctx: Context, budget: Budget, record: dict) -> dict:
    """The cut model with graphs against enforce_eager: float32, float32 with mixed LoRA, bfloat16. The
    prompts' rows finish at different steps, so padded sizes shrink and padding rows come back."""
    from dataplane import SamplingParams

    plan, out = ctx.plan, record.setdefault("graphs_vs_eager", {})
    model = str(resolve(plan.model))
    params = SamplingParams(max_tokens=plan.check_tokens, temperature=0.0, logprobs=5)
    kw = dict(max_num_seqs=16, max_num_batched_tokens=512, kv_cache_memory="256MiB")
    _compare_modes(ctx, record, out, "float32", ctx.loaded(model, "float32"), PROMPTS, params, kw, warm=True)
    if not budget.expired(10):
        names = [f"lora{i}" for i in range(plan.lora_adapters)]
        prompts = (PROMPTS * 4)[: len(names) + 2]
        lora_params = SamplingParams(max_tokens=min(plan.check_tokens, 16), temperature=0.0, logprobs=5)
        part = _compare_modes(ctx, record, out, "float32, mixed LoRA", ctx.loaded(model, "float32"), prompts,
                              lora_params, {**kw, "enable_lora": True, "max_loras": plan.lora_adapters,
                                            "max_lora_rank": plan.lora_rank}, adapters=names + [None, None])
        part["note"] = f", {len(names)} adapters of rank {plan.lora_rank} and 2 base rows"
    ctx.release((model, "float32"))
    if not budget.expired(10):
        _compare_modes(ctx, record, out, "bfloat16", ctx.loaded(model, "bfloat16"), PROMPTS, params, kw)
        ctx.release((model, "bfloat16"))
    return out


def _compare_modes(ctx: Context, record: dict, out: dict, name: str, loaded, prompts: list, params,  # noqa: ANN001
                   kw: dict, warm: bool = False, adapters: list | None = None) -> dict:
    """Eager and graphs engines on `loaded`, the same prompts through both, compared into out[name]."""
    from benchmarks.gpu_lora import add_adapters
    from benchmarks.gpu_sweep import build_llm
    from dataplane.engine.warmup import warm_up

    plan = ctx.plan
    eager = build_llm(loaded, plan.device, "eager", **kw)
    graphs = build_llm(loaded, plan.device, "graphs", **kw)
    if adapters is not None:
        for llm in (eager, graphs):
            add_adapters(llm, plan.work_dir / "adapters", loaded.args, plan.lora_adapters, plan.lora_rank)
    if warm:  # the start-up path a worker runs; its graph count should be one per size
        report = warm_up(graphs.core)
        sizes = len(graphs.core.runner.graphs.sizes)
        out["warmup"] = {**asdict(report), "sizes": sizes}
        if plan.device.startswith("cuda") and report.cuda_graphs != sizes:
            record.setdefault("findings", []).append(
                f"warm-up reported {report.cuda_graphs} CUDA graphs for {sizes} batch sizes: the warm-up's decode "
                "ramp captures each size lazily (DecodeGraphs.run) before warm_up's capture() captures every size "
                "again, so the count and the memory in the log and in /metrics are off")
    dtype = "float32" if name.startswith("float32") else name
    checks = compare_outputs(eager.generate(prompts, params, adapters=adapters),
                             graphs.generate(prompts, params, adapters=adapters), dtype)
    out[name] = {"checks": [vars_of(c) for c in checks], "tolerance": TOLERANCES[dtype][0],
                 "replays": graphs.core.runner.graphs.stats.replays, "prompts": len(prompts),
                 "max_tokens": params.max_tokens}
    print(f"   {name}: {sum(c.ok for c in checks)}/{len(checks)} ok, max logprob err "
          f"{max(c.max_logprob_err for c in checks):.1e}, {out[name]['replays']} graph steps", flush=True)
    return out[name]


def _speed_engines(ctx: Context) -> dict:
    """The sweep's two engines on the full-depth model (graphs captured up front), made once."""
    from benchmarks.gpu_sweep import build_llm, timed_generate

    if ctx.engines:
        return ctx.engines
    plan = ctx.plan
    loaded = ctx.speed()
    tokens = max(max(plan.batches) * plan.prompt_len, max(plan.prefill_lengths), 512)
    kv = _kv_memory(loaded, max(max(plan.batches) * (plan.prompt_len + plan.output_tokens + 16),
                                2 * max(plan.prefill_lengths)))
    for mode in ("graphs", "eager"):
        llm = build_llm(loaded, plan.device, mode, max_num_seqs=max(plan.batches), max_num_batched_tokens=tokens,
                        kv_cache_memory=kv)
        timed_generate(llm, [[100, 101, 102, 103]], 1)  # prefill kernels compiled before the capture
        ctx.engines[mode] = llm
    graphs = ctx.engines["graphs"].core.runner.graphs
    stats = graphs.capture()
    ctx.engines["capture"] = {**asdict(stats), "sizes": graphs.sizes}
    print(f"   captured {stats.graphs} graphs in {stats.capture_seconds:.1f} s, {stats.memory_bytes / 2**20:.0f} MiB",
          flush=True)
    return ctx.engines


def _kv_memory(loaded, tokens: int) -> str:  # noqa: ANN001
    """A KV cache holding `tokens` tokens of this model (and a margin)."""
    from dataplane.runner.model_runner import ModelRunner

    return f"{ModelRunner.kv_bytes_per_token(loaded.model) * tokens // 2**20 + 64}MiB"


def phase_sweep(ctx: Context, budget: Budget, record: dict) -> dict:
    from benchmarks.gpu_sweep import decode_sweep, reference_sweep

    plan = ctx.plan
    sweep = record.setdefault("sweep", {"engine": [], "reference": []})
    sweep["params"] = {"prompt_len": plan.prompt_len, "output_tokens": plan.output_tokens, "batches": plan.batches}
    engines = _speed_engines(ctx)
    sweep["capture"] = engines["capture"]
    reserve = 15 if plan.device.startswith("cuda") else 5  # for the reference columns
    engine_budget = Budget(max(budget.left() - reserve, 1), budget)
    last = 0.0
    for b in plan.batches:  # graphs and eager side by side per batch: a run cut short still compares them
        if engine_budget.expired(2 * last + 2):  # a batch costs about twice the one before it, at most
            print(f"   b={b} and larger: skipped, {engine_budget.left():.0f} s left", flush=True)
            break
        start = time.perf_counter()
        for mode in ("graphs", "eager"):
            decode_sweep(engines[mode], mode, [b], plan.prompt_len, plan.output_tokens, engine_budget,
                         sweep["engine"])
        last = time.perf_counter() - start
    # the same engine sampling (temperature + top-p, seeded): what the sampler costs a step under graphs
    from benchmarks.gpu_sweep import SAMPLED, SAMPLED_MODE

    sweep["sampled"] = SAMPLED
    decode_sweep(engines["graphs"], SAMPLED_MODE, plan.sampled_batches, plan.prompt_len, plan.output_tokens,
                 engine_budget, sweep["engine"], sampling=SAMPLED)
    args = ctx.speed_args
    ctx_len = plan.prompt_len + plan.output_tokens // 2
    from dataplane.config import resolve_dtype

    dtype = resolve_dtype(plan.dtype, plan.device)
    if plan.device.startswith("cuda"):
        reference_sweep(args, plan.device, dtype, plan.batches, ctx_len, budget, sweep["reference"], graph=True)
    reference_sweep(args, plan.device, dtype, plan.batches, ctx_len, budget, sweep["reference"], graph=False)
    return sweep


def phase_profile(ctx: Context, budget: Budget, record: dict) -> list:
    from benchmarks.gpu_profile import profile_decode

    plan = ctx.plan
    rows = record.setdefault("profile", [])
    engines = _speed_engines(ctx)
    for b in plan.profile_batches:
        for mode in ("graphs", "eager"):
            if budget.expired(5):
                return rows
            p = profile_decode(engines[mode], b, plan.prompt_len, mode, steps=plan.profile_steps, salt=500 + b)
            rows.append(p.as_dict())
            print(f"   b={b} {mode}: {p.verdict}", flush=True)
    return rows


def phase_lora(ctx: Context, budget: Budget, record: dict) -> dict:
    from benchmarks.gpu_lora import add_adapters, mixed
    from benchmarks.gpu_sweep import build_llm, decode_sweep, timed_generate

    plan = ctx.plan
    for mode in ("graphs", "eager"):  # the sweep's engines' memory back before this one's
        ctx.engines.pop(mode, None)
    ctx.release()
    loaded = ctx.speed()
    b = plan.lora_batch
    kv = _kv_memory(loaded, b * (plan.prompt_len + plan.output_tokens + 16))
    llm = build_llm(loaded, plan.device, "graphs", max_num_seqs=b, max_num_batched_tokens=max(512, b * plan.prompt_len),
                    kv_cache_memory=kv, enable_lora=True, max_loras=plan.lora_adapters, max_lora_rank=plan.lora_rank)
    names = add_adapters(llm, plan.work_dir / "adapters", loaded.args, plan.lora_adapters, plan.lora_rank)
    timed_generate(llm, [[100, 101, 102, 103]], 1)
    stats = llm.core.runner.graphs.capture()
    rows: list[dict] = []
    out = {"adapters": len(names), "rank": plan.lora_rank, "batch": b, "rows": rows,
           "capture": asdict(stats)}
    decode_sweep(llm, "base", [b], plan.prompt_len, plan.output_tokens, budget, rows)
    decode_sweep(llm, "mixed", [b], plan.prompt_len, plan.output_tokens, budget, rows,
                 adapters_for=lambda n: mixed(names, n))
    by = {r["mode"]: r for r in rows}
    if "base" in by and "mixed" in by:
        out.update(base_tok_s=by["base"]["tok_s"], mixed_tok_s=by["mixed"]["tok_s"],
                   ratio=by["mixed"]["tok_s"] / by["base"]["tok_s"])
        print(f"   mixed / base: {out['ratio']:.0%}", flush=True)
    return out


def phase_prefill(ctx: Context, budget: Budget, record: dict) -> list:
    from benchmarks.gpu_sweep import prefill_sweep

    rows = record.setdefault("prefill", [])
    prefill_sweep(_speed_engines(ctx)["graphs"], ctx.plan.prefill_lengths, budget, rows)
    return rows


def phase_engine_vs_cpu(ctx: Context, budget: Budget, record: dict) -> list:
    """The cut model on CUDA (Triton kernels) against the CPU path, float32, greedy."""
    from dataplane import SamplingParams
    from dataplane.engine.llm import LLM

    plan = ctx.plan
    # The CPU side runs the torch references (the Triton kernels' twins), not the C++ CPU kernels: their
    # build would spend the lent machine's minutes compiling (read once per process: nothing built them yet).
    os.environ.setdefault("TESSERA_CPU_KERNELS", "0")
    params = SamplingParams(max_tokens=plan.check_tokens, temperature=0.0, logprobs=5)
    outs = [LLM(plan.model, dtype="float32", device=device, max_num_seqs=8, kv_cache_memory="256MiB")
            .generate(PROMPTS[:4], params) for device in ("cpu", plan.device)]
    return [vars_of(c) for c in compare_outputs(outs[0], outs[1], "float32")]


def phase_kernels(ctx: Context, budget: Budget, record: dict) -> list:
    from benchmarks.gpu_check_kernels import PRODUCTION, kernel_table

    return [vars_of(r) for r in kernel_table(PRODUCTION, "cuda")]


PHASE_FNS = {"setup": phase_setup, "graphs_vs_eager": phase_graphs_vs_eager, "sweep": phase_sweep,
             "profile": phase_profile, "lora": phase_lora, "prefill": phase_prefill,
             "engine_vs_cpu": phase_engine_vs_cpu, "kernels": phase_kernels}
CUDA_ONLY = ("engine_vs_cpu", "kernels")


def roofline(ctx: Context, record: dict) -> dict | None:
    """Points from the sweep, the reference and the prefill, under the ceilings; the PNG beside the table."""
    from benchmarks.roofline import Ceilings, Point, decode_work, plot, prefill_work

    if ctx.ceilings is None and (record.get("setup") or {}).get("ceilings"):
        ctx.ceilings = Ceilings(**record["setup"]["ceilings"])
    if ctx.ceilings is None:
        return None
    plan, args = ctx.plan, ctx.speed_args
    if args is None:
        return None
    size = torch.tensor([], dtype=_dtype(plan)).element_size()
    sweep = record.get("sweep") or {}
    mean_ctx = plan.prompt_len + plan.output_tokens / 2
    points = []
    for r in sweep.get("engine", []):
        if r["step_ms"] > 0 and r["mode"] in ("graphs", "eager"):  # the greedy sweep (sampled rows add no work)
            points.append(Point(f"engine, {'CUDA graphs' if r['mode'] == 'graphs' else 'eager'}",
                                f"b{r['batch']}", decode_work(args, r["batch"], mean_ctx, size), r["step_ms"] / 1e3,
                                r["batch"]))
    for r in sweep.get("reference", []):
        points.append(Point(f"plain torch, {'one CUDA graph' if r['graph'] else 'eager'}", f"b{r['batch']}",
                            decode_work(args, r["batch"], r["ctx"], size), r["ms"] / 1e3, r["batch"]))
    for r in record.get("prefill") or []:
        points.append(Point("engine prefill (one prompt)", _tokens_label(r["tokens"]),
                            prefill_work(args, r["tokens"], size), r["seconds"], r["tokens"]))
    if not points:
        return None
    png = plan.results_dir / "gpu_check_roofline.png"
    title = (f"{record.get('gpu') or 'CPU rehearsal'}: {Path(ctx.speed_model).name}, {plan.dtype}, "
             f"decode at mean context {mean_ctx:.0f}")
    message = plot(points, ctx.ceilings, png, title)
    return {"ceilings": asdict(ctx.ceilings), "points": [p.row(ctx.ceilings) for p in points], "png": message,
            "png_file": png.name if png.exists() and "written" in message else None}


def _tokens_label(n: int) -> str:
    return f"{round(n / 1024)}k" if n >= 1000 else str(n)


def _dtype(plan: Plan) -> torch.dtype:
    from dataplane.config import resolve_dtype

    return resolve_dtype(plan.dtype, plan.device)
