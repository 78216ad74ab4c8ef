"""The check to run the day a GPU is lent: is the CUDA path right, how fast is it, and what limits it?

    python -m benchmarks.gpu_check [--model PATH_OR_ALIAS] [--layers 30] [--results-dir DIR] [--budget 330]

One command, sized for 6 minutes on an H100 or H200 (estimates per phase in docs/kernels.md), with the
6-layer SmolLM2 cut shipped (a lent machine receives 64 MiB; the full GGUF is 98 MB) and a 30-layer
model rebuilt from it there (benchmarks/gguf_repeat.py). Phases, each in its own time budget, the
results written after every one (benchmarks/gpu_phases.py), PYTHONUNBUFFERED for a live log:
1. setup: the GPU's ceilings (copy bandwidth, bf16 matmul), the full-depth model built;
2. graphs_vs_eager: the cut model, CUDA graphs against enforce_eager, float32 and bfloat16, greedy
   tokens and logprobs (benchmarks/gpu_compare.py); 8 LoRA adapters mixed likewise; the warm-up's
   graph capture counted;
3. sweep: decode at batch 1, 8, 32, 128, 256, graphs on and off, against the plain-torch step as one
   CUDA graph at the same shapes (benchmarks/gpu_sweep.py, benchmarks/plain_step.py);
4. profile: per decode step launches, host ms, GPU ms, and the bottleneck named (benchmarks/gpu_profile.py);
5. prefill: one prompt of 128 to 8k tokens, for the roofline;
6. lora: 8 adapters mixed in a batch of 32 against the base model, under graphs (benchmarks/gpu_lora.py);
7. engine_vs_cpu: the cut model on CUDA with the Triton kernels against the CPU path, float32;
8. kernels: every Triton kernel against its torch twin at production shapes (benchmarks/gpu_check_kernels.py).
Then the roofline PNG (benchmarks/roofline.py, matplotlib) and the targets as pass/fail lines
(benchmarks/gpu_report.py). Results: DIR/gpu_check.{json,md} and DIR/gpu_check_roofline.png
(default benchmarks/results). Exit status: 0 all correct and every target met, 1 a correctness
mismatch, 2 correct but a target missed or not measured.

On the lent machine (docs/kernels.md, "The GPU check"): ship the cut and the gguf wheel, nothing else.
Here, once (both folders are in .gitignore):

    python -m benchmarks.gguf_truncate --layers 6 --out .gpu/smollm2-6l.gguf
    python3 -m pip download --no-deps gguf==0.19.0 --python-version 3.12 --only-binary=:all: -d .whl

then the device run, carry [".gpu", ".whl"], timeout_s 420, this one command:

    set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 && timeout 360 python3 -m benchmarks.gpu_check \
      --model .gpu/smollm2-6l.gguf --results-dir $OUT 2>&1 | tee $OUT/gpu_check.log

Without CUDA it says so and exits 0. `--device cpu` is a rehearsal of every phase on the CPU at small
sizes (the padded graph-safe step eagerly, no CUDA graph, no Triton): it tests this code, its numbers
mean nothing (tests/benchmarks/test_gpu_check_rehearsal.py runs it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from benchmarks.common import RESULTS, environment
from benchmarks.gpu_compare import TOLERANCES, compare_outputs, vars_of
from benchmarks.gpu_phases import Budget, run_phase
from benchmarks.gpu_report import correctness_ok, render, targets

MODEL = "smollm2-135m-instruct"
PROMPTS = [
    "The capital of France is",
    "Write a haiku about a river in spring.",
    "def fibonacci(n):\n    ",
    "Explain what a paged KV cache is, in two sentences.",
    "List three colours of the rainbow:",  # a fifth row: a batch of 5 runs padded to 8
]
PHASES = ("setup", "graphs_vs_eager", "sweep", "profile", "prefill", "lora", "engine_vs_cpu", "kernels")
# Each phase's budget (seconds), the caps of a 6-minute run on an H100; the whole run's --budget caps them all.
BUDGETS = {"setup": 50, "graphs_vs_eager": 80, "sweep": 100, "profile": 50, "lora": 50, "prefill": 30,
           "engine_vs_cpu": 40, "kernels": 60}


@dataclass(slots=True)
class Plan:
    device: str
    model: str  # the cut model: correctness phases
    layers: int  # the speed model's depth (0: the cut itself)
    dtype: str  # the speed phases' dtype
    results_dir: Path
    work_dir: Path
    budget: float
    batches: list[int] = field(default_factory=lambda: [1, 8, 32, 128, 256])
    prompt_len: int = 32
    output_tokens: int = 128
    prefill_lengths: list[int] = field(default_factory=lambda: [128, 256, 512, 1024, 2048, 4096, 8192])
    profile_batches: list[int] = field(default_factory=lambda: [1, 32, 128])
    profile_steps: int = 16
    lora_batch: int = 32
    lora_adapters: int = 8
    lora_rank: int = 16
    check_tokens: int = 32
    skip: tuple[str, ...] = ()
    budget_scale: float = 1.0  # phases' budgets times this (a CPU rehearsal's steps are slow)

    @classmethod
    def rehearsal(cls, **kw: object) -> Plan:
        """The CPU rehearsal's small sizes: every phase's code runs in a minute or two on two cores."""
        small = dict(batches=[1, 4], prompt_len=8, output_tokens=6, prefill_lengths=[16, 48], profile_batches=[2],
                     profile_steps=3, lora_batch=4, lora_adapters=2, lora_rank=4, check_tokens=6, budget_scale=5.0)
        return cls(**{**small, **kw})  # type: ignore[arg-type]


class Context:
    """What the phases share: loaded models (one load per file and dtype) and the sweep's engines."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.speed_model: str | None = None
        self.speed_args = None  # the speed model's LlamaArgs, once loaded (the roofline counts with them)
        self.ceilings = None
        self.engines: dict[str, object] = {}
        self._models: dict[tuple[str, str], object] = {}

    def speed(self):  # noqa: ANN201
        """The speed phases' model, loaded (built on first use: setup does it, a later phase if setup failed)."""
        if self.speed_model is None:
            self.speed_model = speed_model(self.plan.model, self.plan.layers, self.plan.work_dir)
        loaded = self.loaded(self.speed_model, self.plan.dtype)
        self.speed_args = loaded.args
        return loaded

    def loaded(self, path: str, dtype: str):  # noqa: ANN201
        from dataplane.config import resolve_dtype
        from dataplane.models.loader import load_model

        key = (path, dtype)
        if key not in self._models:
            start = time.perf_counter()
            self._models[key] = load_model(path, resolve_dtype(dtype, self.plan.device), self.plan.device,
                                           progress=False)
            print(f"   loaded {Path(path).name} ({dtype}) in {time.perf_counter() - start:.1f} s", flush=True)
        return self._models[key]

    def release(self, *paths_dtypes: tuple[str, str]) -> None:
        for key in paths_dtypes:
            self._models.pop(key, None)
        gc.collect()
        if self.plan.device.startswith("cuda"):
            torch.cuda.empty_cache()


# -- phases ---------------------------------------------------------------------------------------
def phase_setup(ctx: Context, budget: Budget, record: dict) -> dict:
    from benchmarks.roofline import measure_ceilings

    plan = ctx.plan
    ctx.ceilings = measure_ceilings(plan.device)
    c = ctx.ceilings
    print(f"   ceilings: {c.bandwidth / 1e12:.2f} TB/s copy, {c.peak_flops / 1e12:.1f} TFLOP/s {c.dtype}", flush=True)
    ctx.speed()
    record["speed_model"] = ctx.speed_model
    return {"ceilings": asdict(c)}


def speed_model(model: str, layers: int, work_dir: Path) -> str:
    """The model the speed phases run: `model` itself, or a copy with `layers` blocks (repeated or cut)."""
    from benchmarks.gguf_repeat import repeat
    from benchmarks.gguf_truncate import block_count, truncate
    from dataplane.models.registry import resolve_model_path

    path = resolve_model_path(model)
    if not layers or not path.is_file():
        return str(path)
    have = block_count(path)
    if have == layers:
        return str(path)
    out = work_dir / f"{path.stem}-{layers}l.gguf"
    if not out.exists():
        start = time.perf_counter()
        work_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        (repeat if layers > have else truncate)(path, tmp, layers)
        tmp.rename(out)
        print(f"   built {out.name} ({layers} layers from {have}) in {time.perf_counter() - start:.1f} s", flush=True)
    return str(out)


def phase_graphs_vs_eager(ctx: Context, budget: Budget, record: dict) -> dict:
    """The cut model with graphs against enforce_eager: float32, float32 with mixed LoRA, bfloat16. The
    prompts' rows finish at different steps, so padded sizes shrink and padding rows come back."""
    from dataplane import SamplingParams

    plan, out = ctx.plan, record.setdefault("graphs_vs_eager", {})
    model = str(_resolve(plan.model))
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
        if r["step_ms"] > 0:
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


def _resolve(model: str) -> Path:
    from dataplane.models.registry import resolve_model_path

    return resolve_model_path(model)


def save(record: dict, results_dir: Path) -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    record["targets"] = [asdict(t) for t in targets(record)]
    record["correct"] = correctness_ok(record)
    (results_dir / "gpu_check.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (results_dir / "gpu_check.md").write_text(render(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL, help="alias, .gguf file or model directory (default: SmolLM2-135M)")
    ap.add_argument("--layers", type=int, default=30,
                    help="depth of the speed phases' model, rebuilt from --model's blocks (0: --model as it is)")
    ap.add_argument("--device", default=None, help="cuda (default where present) or cpu (a rehearsal: small sizes)")
    ap.add_argument("--dtype", default=None, help="the speed phases' dtype (default bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/tessera-gpu-check"),
                    help="where the full-depth GGUF and the adapters are written")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run, phases capped by it (default 330; a CPU rehearsal 1800)")
    ap.add_argument("--skip", default="", help=f"comma-separated phases to skip: {', '.join(PHASES[1:])}")
    ap.add_argument("--max-tokens", type=int, default=None, help="greedy tokens per prompt in the correctness phases")
    args = ap.parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this host (torch.cuda.is_available() is False); nothing to check. "
              "Run it where a GPU is lent (or `--device cpu` to rehearse the check itself).")
        return 0
    device = args.device or "cuda"
    cuda = device.startswith("cuda")
    if cuda:
        from kernels.dispatch import triton_available, use_triton

        if not triton_available() or not use_triton("cuda"):
            print("gpu_check: CUDA is present but the Triton kernels are not in use (triton missing, or "
                  "TESSERA_KERNELS=torch); install the 'gpu' extra and unset TESSERA_KERNELS.")
            return 1
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    common = dict(device=device, model=args.model, layers=args.layers, dtype=dtype, results_dir=args.results_dir,
                  work_dir=args.work_dir, budget=args.budget or (330.0 if cuda else 1800.0),
                  skip=tuple(s for s in args.skip.split(",") if s) + (() if cuda else CUDA_ONLY))
    plan = Plan(**common) if cuda else Plan.rehearsal(**common)
    if args.max_tokens:
        plan.check_tokens = args.max_tokens
    unknown = set(plan.skip) - set(PHASES)
    if unknown:
        ap.error(f"--skip: unknown phases {sorted(unknown)}; they are {', '.join(PHASES)}")
    overall = Budget(plan.budget)
    record: dict = {"device": device, "gpu": torch.cuda.get_device_name(0) if cuda else None,
                    "date": time.strftime("%Y-%m-%d"), "model": plan.model, "speed_model": None,
                    "speed_layers": plan.layers, "speed_dtype": plan.dtype, "plan": asdict(plan),
                    "env": {**environment(), "cuda": torch.version.cuda, "triton": _triton_version()}}
    ctx = Context(plan)

    def write() -> None:
        save(record, plan.results_dir)

    for name in PHASES:
        if name in plan.skip:
            record.setdefault("phases", {})[name] = {"status": "skipped (--skip or no CUDA)", "seconds": 0.0,
                                                     "budget": 0.0}
            continue
        fn = PHASE_FNS[name]
        run_phase(name, BUDGETS[name] * plan.budget_scale, lambda budget, fn=fn: fn(ctx, budget, record), record, overall, write)
        record["speed_model"] = ctx.speed_model
    try:
        record["roofline"] = roofline(ctx, record)
    except Exception as exc:  # noqa: BLE001 - the picture must not lose the table
        record["roofline"] = None
        print(f"roofline failed: {exc!r}", flush=True)
    write()
    print(render(record), flush=True)
    correct = correctness_ok(record)
    if correct is False:
        return 1
    return 0 if all(t["ok"] for t in record["targets"]) and correct else 2


def _triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
