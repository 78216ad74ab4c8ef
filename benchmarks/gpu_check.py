"""The check to run the day a GPU is lent: is the CUDA path right, how fast is it, and what limits it?

    python -m benchmarks.gpu_check [--model PATH_OR_ALIAS] [--layers 30] [--results-dir DIR] [--budget 330]

One command, sized for 6 minutes on an H100 or H200 (estimates per phase in docs/kernels.md), with the
6-layer SmolLM2 cut shipped (a lent machine receives 64 MiB; the full GGUF is 98 MB) and a 30-layer
model rebuilt from it there (benchmarks/gguf_repeat.py). Phases, each in its own time budget, the
results written after every one (benchmarks/gpu_phases.py), PYTHONUNBUFFERED for a live log; the
phases are in benchmarks/gpu_check_phases.py, the run's sizes and shared models in benchmarks/gpu_plan.py:
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
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.common import RESULTS, environment
from benchmarks.gpu_check_phases import CUDA_ONLY, PHASE_FNS, roofline
from benchmarks.gpu_phases import Budget, run_phase
from benchmarks.gpu_plan import BUDGETS, MODEL, PHASES, Context, Plan
from benchmarks.gpu_report import correctness_ok, render, targets


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
