"""Timing and reporting shared by the kernel benchmarks.

Each benchmark names its cases (SmolLM2-135M shapes) and, per case, the implementations to
time: the torch reference (the CPU engine's path), the best library equivalent, and the
Triton kernel when a CUDA device is present. Interpreter timings of the kernel would measure
Python, not the kernel, so on the CPU it is skipped with a note.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.common import environment

RESULTS = Path(__file__).resolve().parents[1] / "results" / "kernels"

# One thread unless TESSERA_BENCH_THREADS says otherwise: the two cores here are shared, and a
# two-thread OpenMP region that loses a core to another process stalls at its barrier. Measured
# while another process held one core: F.rms_norm on 512x576 bf16 took 0.52 ms on one thread
# and 17.7 ms on two.
BENCH_THREADS = int(os.environ.get("TESSERA_BENCH_THREADS", "1"))
TRITON_SKIPPED = "Triton kernel not timed: no CUDA device (interpreter timings measure Python, not the kernel)"

# SmolLM2-135M.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 576, 9, 3, 64, 1536, 49152


@dataclass
class Report:
    op: str
    device: torch.device
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def device() -> torch.device:
    torch.set_num_threads(BENCH_THREADS)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def triton_timed(report: Report) -> bool:
    """Whether the Triton kernel is timed here; adds the skip note once when it is not."""
    if report.device.type == "cuda":
        return True
    if TRITON_SKIPPED not in report.notes:
        report.notes.append(TRITON_SKIPPED)
        print(f"[{report.op}] {TRITON_SKIPPED}")
    return False


def time_us(fn: Callable[[], object], *, budget_s: float = 0.25, repeats: int = 7) -> float:
    """Microseconds per call: the best of `repeats` batches that together take about `budget_s`.

    The best, not the median: on a shared machine the slow batches measure the neighbours.
    """
    if torch.cuda.is_available():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=int(budget_s * 1000))) * 1000
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    per_batch = max(1, int(budget_s / repeats / once))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter() - start) / per_batch)
    return min(samples) * 1e6


def measure(report: Report, case: str, impls: dict[str, Callable[[], object]], **extra: object) -> None:
    for name, fn in impls.items():
        us = time_us(fn)
        report.rows.append({"case": case, "impl": name, "us": round(us, 2), **extra})
        print(f"[{report.op}] {case:<34} {name:<24} {us:10.1f} us")


def write(report: Report, baseline: str = "reference") -> tuple[Path, Path]:
    """results/kernels/<op>.json and .md; the table shows each case's times and speed-up over `baseline`."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    env = environment()  # torch, threads, CPU name and extensions, time
    env.update({"device": torch.cuda.get_device_name() if report.device.type == "cuda" else env["cpu"],
                "load_average_1m": os.getloadavg()[0], "kernels_env": os.environ.get("TESSERA_KERNELS", "auto")})
    data = {"op": report.op, "environment": env, "rows": report.rows, "notes": report.notes}
    json_path = RESULTS / f"{report.op}.json"
    json_path.write_text(json.dumps(data, indent=2) + "\n")

    impls = list(dict.fromkeys(r["impl"] for r in report.rows))
    cases = list(dict.fromkeys(r["case"] for r in report.rows))
    by_key = {(r["case"], r["impl"]): r["us"] for r in report.rows}
    lines = [f"# {report.op} ({env['device']}, {env['threads']} threads, torch {env['torch']}, {env['when']})", "",
             "| case | " + " | ".join(f"{i} µs" for i in impls) + " | best vs " + baseline + " |",
             "|---|" + "---:|" * (len(impls) + 1)]
    for case in cases:
        times = [by_key.get((case, i)) for i in impls]
        base = by_key.get((case, baseline))
        present = [(t, i) for t, i in zip(times, impls, strict=True) if t is not None and i != baseline]
        best = min(present) if present else None
        speed = f"{base / best[0]:.2f}× ({best[1]})" if base and best else "–"
        cells = " | ".join("–" if t is None else f"{t:.1f}" for t in times)
        lines.append(f"| {case} | {cells} | {speed} |")
    lines += [""] + [f"- {n}" for n in report.notes]
    md_path = RESULTS / f"{report.op}.md"
    md_path.write_text("\n".join(lines) + "\n")
    print(f"[{report.op}] wrote {json_path.relative_to(RESULTS.parents[2])} and .md")
    return json_path, md_path
