"""What a GPU check run is sized to (Plan), and what its phases share (Context): the loaded models, one
load per file and dtype, and the full-depth model the speed phases run (benchmarks/gguf_repeat.py)."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

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
    sampled_batches: list[int] = field(default_factory=lambda: [32, 128])  # under graphs, temperature + top-p
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
        small = dict(batches=[1, 4], sampled_batches=[4], prompt_len=8, output_tokens=6, prefill_lengths=[16, 48], profile_batches=[2],
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
    out = work_dir / f"{path.stem}-{path.stat().st_size}-{layers}l.gguf"  # another cut of the same name: rebuilt
    if not out.exists():
        start = time.perf_counter()
        work_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        (repeat if layers > have else truncate)(path, tmp, layers)
        tmp.rename(out)
        print(f"   built {out.name} ({layers} layers from {have}) in {time.perf_counter() - start:.1f} s", flush=True)
    return str(out)


def resolve(model: str) -> Path:
    from dataplane.models.registry import resolve_model_path

    return resolve_model_path(model)
