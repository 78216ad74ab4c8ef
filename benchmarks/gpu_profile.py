"""Where a decode step's time goes, so that the GPU check names the next bottleneck itself.

A batch of requests is brought past its prefill, then decode steps are timed without the profiler
(wall ms a step) and profiled with torch.profiler (kernels, launches, copies, synchronizations, the
device's kernel time). Per step:
- GPU ms: the kernels' device time; GPU busy = GPU ms / wall ms;
- launches: kernel launches the host made (cudaLaunchKernel, Triton's cuLaunchKernel) plus graph
  launches: a step replayed as one CUDA graph is one launch however many kernels it runs;
- host ms: the wall time less the time the host sat in a synchronization (waiting for the GPU);
- the verdict: GPU-bound (busy >= 85 %) names the kernels that take the step's time (shares of the
  kernel time), host-bound names the host operations (shares of their self CPU time, the profiler's)
  and the launches, copies and synchronizations.
The profiler's own overhead inflates the profiled window; only shares and counts are read from it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
BUSY_GPU = 0.85  # kernels this much of the wall step: the GPU is the limit


@dataclass(frozen=True, slots=True)
class ProfileEntry:
    name: str
    count: int
    self_cpu_us: float
    device_us: float
    on_device: bool  # a kernel, copy or set that ran on the GPU (not a host-side call)


@dataclass(slots=True)
class StepProfile:
    batch: int
    mode: str  # "graphs" or "eager"
    steps: int  # profiled steps
    wall_ms: float  # a step, unprofiled
    gpu_ms: float = 0.0
    kernels: float = 0.0  # kernels run on the GPU a step
    launches: float = 0.0  # kernel and graph launches from the host a step
    graph_launches: float = 0.0
    copies: float = 0.0  # cudaMemcpy* calls a step (each direction)
    syncs: float = 0.0
    sync_wait_ms: float = 0.0
    host_ms: float = 0.0
    host_op_ms: float = 0.0  # the profiler's self CPU time of host operations a step (inflated by it)
    gpu_busy: float = 0.0
    replays: int | None = None  # graph (or padded) steps among the profiled ones
    top_host: list[tuple[str, float]] = field(default_factory=list)  # (op, ms a step)
    top_kernels: list[tuple[str, float]] = field(default_factory=list)
    verdict: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def entries_from(prof: torch.profiler.profile) -> list[ProfileEntry]:
    """The profile's averages as plain entries (attribute names moved between torch versions)."""
    out = []
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "self_cuda_time_total", 0.0)
        kind = str(getattr(e, "device_type", ""))
        on_device = kind.endswith(("CUDA", "PrivateUse1")) or (bool(device_us) and not e.self_cpu_time_total)
        out.append(ProfileEntry(e.key, int(e.count), float(e.self_cpu_time_total), float(device_us or 0.0),
                                on_device))
    return out


def summarize(entries: list[ProfileEntry], batch: int, mode: str, steps: int, wall_ms: float,
              replays: int | None = None, top: int = 5, on_gpu: bool = False) -> StepProfile:
    """Per-step figures of `steps` profiled steps; `on_gpu`: the steps ran on a GPU (kernels were expected)."""
    p = StepProfile(batch, mode, steps, wall_ms, replays=replays)
    host_ops: list[tuple[str, float]] = []
    kernels: list[tuple[str, float]] = []
    for e in entries:
        if e.on_device:
            p.gpu_ms += e.device_us / 1e3
            if not e.name.startswith(("Memcpy", "Memset")):
                p.kernels += e.count
                kernels.append((e.name, e.device_us / 1e3))
            continue
        if e.name in LAUNCHES:
            p.launches += e.count
        elif e.name in GRAPH_LAUNCHES:
            p.launches += e.count
            p.graph_launches += e.count
        if e.name.startswith(("cudaMemcpy", "cuMemcpy")):
            p.copies += e.count
        if "Synchronize" in e.name or e.name == "cudaMemcpy":  # the host waiting for the device
            p.syncs += e.count
            p.sync_wait_ms += e.self_cpu_us / 1e3
        else:
            host_ops.append((e.name, e.self_cpu_us / 1e3))
    p.host_op_ms = sum(t for _, t in host_ops)
    for name in ("gpu_ms", "kernels", "launches", "graph_launches", "copies", "syncs", "sync_wait_ms", "host_op_ms"):
        setattr(p, name, getattr(p, name) / steps)
    p.host_ms = max(wall_ms - p.sync_wait_ms, 0.0)
    p.gpu_busy = p.gpu_ms / wall_ms if wall_ms > 0 else 0.0
    p.top_host = [(n[:80], t / steps) for n, t in sorted(host_ops, key=lambda x: -x[1])[:top]]
    p.top_kernels = [(n[:80], t / steps) for n, t in sorted(kernels, key=lambda x: -x[1])[:top]]
    p.verdict = verdict(p, on_gpu)
    return p


def verdict(p: StepProfile, on_gpu: bool = False) -> str:
    def listed(items: list[tuple[str, float]], total: float) -> str:
        return "; ".join(f"{n} {t:.3f} ms ({t / total:.0%})" if total > 0 else f"{n} {t:.3f} ms" for n, t in items[:3])

    if p.gpu_ms <= 0:
        why = ("the profiler traced no kernel (are graph replays traced by this CUPTI?)" if on_gpu
               else "a CPU run")
        return (f"no GPU kernels recorded ({why}): {p.wall_ms:.2f} ms a step; host ops by self time: "
                f"{listed(p.top_host, p.host_op_ms)}")
    if p.gpu_busy >= BUSY_GPU:
        return (f"GPU-bound: kernels fill {p.gpu_busy:.0%} of the {p.wall_ms:.2f} ms step; next: "
                f"{listed(p.top_kernels, p.gpu_ms)}")
    return (f"host-bound: the GPU idles {1 - p.gpu_busy:.0%} of the {p.wall_ms:.2f} ms step "
            f"({p.gpu_ms:.2f} ms of kernels, {p.launches:.0f} launches, {p.copies:.0f} copies, {p.syncs:.0f} syncs); "
            f"host ops by self time: {listed(p.top_host, p.host_op_ms)}")


def profile_decode(llm, batch: int, prompt_len: int, mode: str, *, steps: int = 16, warm: int = 4,  # noqa: ANN001
                   salt: int = 0) -> StepProfile:
    """`batch` requests of `prompt_len` tokens past their prefill and `warm` steps, `steps` decode steps timed
    without the profiler, `steps` more profiled, then run to their end."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.gpu_sweep import synthetic_prompts
    from dataplane import SamplingParams

    core = llm.core
    device = core.model.device
    params = SamplingParams(max_tokens=warm + 2 * steps + 2, temperature=0.0, ignore_eos=True)
    for ids in synthetic_prompts(batch, prompt_len, core.model.args.vocab_size, salt):
        rid, text, children = core.make_requests(ids, params)
        core.add(rid, text, children)
    for _ in range(warm):
        core.step(final_only=True)
    if core.scheduler.waiting:
        raise RuntimeError(f"profile: {len(core.scheduler.waiting)} requests still waiting after the warm steps; "
                           "raise max_num_seqs or max_num_batched_tokens")
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        core.step(final_only=True)
    _sync(device)
    wall_ms = 1000 * (time.perf_counter() - start) / steps
    graphs = core.runner.graphs
    before = graphs.stats.replays if graphs is not None else None
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            core.step(final_only=True)
        _sync(device)
    replays = graphs.stats.replays - before if graphs is not None else None
    while core.has_unfinished():
        core.step(final_only=True)
    return summarize(entries_from(prof), batch, mode, steps, wall_ms, replays, on_gpu=device.type == "cuda")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
