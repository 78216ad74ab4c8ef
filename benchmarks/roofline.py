"""The roofline of the GPU check: each measured step's FLOP/s against its arithmetic intensity, under the
GPU's memory-bandwidth and compute ceilings (measured in the same run).

A step's work is counted from the model's shapes, not read from counters:
- FLOPs: 2 per weight per token through every projection and the lm head, and attention's two
  products (QK^T and PV: 4 x heads x head_dim per query per key; a prefill of L tokens has
  L(L+1)/2 query-key pairs, a decode row `ctx`);
- bytes: every weight once per step (a decode step streams them all whatever its batch), the K/V it
  reads (a decode row's whole context; a prefill's keys stay on chip in flash-style attention, so only
  its writes count) and writes, and the activations each unfused op reads and writes (`_ACTIVATIONS`).
So the intensity is that of the engine's step as it is (unfused ops included), and the ceiling
min(peak, bandwidth x intensity) is what that step could reach: a point far under its roof is lost to
the host or to kernels, one near the sloped roof is memory-bound, near the flat one compute-bound.
The PNG needs matplotlib (on the GPU machines' image); without it the table and the JSON still carry
every number the picture would (`plot_data`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dataplane.models.config import LlamaArgs


@dataclass(frozen=True, slots=True)
class Ceilings:
    device: str
    bandwidth: float  # bytes/s, counting bytes read and written (a device-to-device copy)
    peak_flops: float  # FLOP/s of a large matrix product in the measured dtype
    dtype: str

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) where the two roofs meet: below it a step is memory-bound."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        return min(self.peak_flops, self.bandwidth * intensity)


@dataclass(frozen=True, slots=True)
class Work:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def matmul_params(a: LlamaArgs) -> int:
    """Weights a token multiplies through: every layer's projections and the lm head."""
    h, q, kv, i = a.hidden_size, a.q_size, a.kv_size, a.intermediate_size
    return a.num_layers * (h * (q + 2 * kv) + q * h + 2 * i * h + i * h) + a.vocab_size * h


def kv_bytes_per_token(a: LlamaArgs, dtype_bytes: int) -> int:
    return 2 * a.num_layers * a.num_kv_heads * a.head_dim * dtype_bytes


def _activations(a: LlamaArgs) -> int:
    """Elements one token's activations move (read + write) through one layer of unfused ops: norm (h in,
    h out), QKV (h, q + 2kv), rotary (q + kv both ways), attention (q in, q out), o (q, h), residual add
    (2h, h), norm (h, h), gate-up (h, 2i), SiLU-and-mul (2i, i), down (i, h), residual add (2h, h)."""
    h, q, kv, i = a.hidden_size, a.q_size, a.kv_size, a.intermediate_size
    return 2 * h + (h + q + 2 * kv) + 2 * (q + kv) + 2 * q + (q + h) + 3 * h + 2 * h + (h + 2 * i) + 3 * i + (i + h) \
        + 3 * h


def decode_work(a: LlamaArgs, batch: int, ctx: float, dtype_bytes: int = 2) -> Work:
    """One decode step of `batch` rows, each attending to `ctx` tokens (its own included)."""
    flops = 2 * batch * matmul_params(a) + 4 * batch * ctx * a.q_size * a.num_layers
    kv = kv_bytes_per_token(a, dtype_bytes)
    moved = (matmul_params(a) * dtype_bytes + batch * ctx * kv + batch * kv
             + batch * a.num_layers * _activations(a) * dtype_bytes)
    return Work(float(flops), float(moved))


def prefill_work(a: LlamaArgs, tokens: int, dtype_bytes: int = 2) -> Work:
    """One prompt of `tokens` tokens prefilled in one step (causal attention)."""
    pairs = tokens * (tokens + 1) / 2
    flops = 2 * tokens * matmul_params(a) + 4 * pairs * a.q_size * a.num_layers
    moved = (matmul_params(a) * dtype_bytes + tokens * kv_bytes_per_token(a, dtype_bytes)
             + tokens * a.num_layers * _activations(a) * dtype_bytes)
    return Work(float(flops), float(moved))


@dataclass(frozen=True, slots=True)
class Point:
    series: str  # e.g. "engine, CUDA graphs"
    label: str  # e.g. "b32" or "2k"
    work: Work
    seconds: float  # measured time of the step
    tokens: int  # tokens the step produced (decode) or consumed (prefill)

    @property
    def flops_per_s(self) -> float:
        return self.work.flops / self.seconds

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    def regime(self, c: Ceilings) -> str:
        return "memory-bound" if self.work.intensity < c.ridge else "compute-bound"

    def of_roof(self, c: Ceilings) -> float:
        """Measured FLOP/s as a fraction of the roof above the point."""
        return self.flops_per_s / c.attainable(self.work.intensity)

    def row(self, c: Ceilings) -> dict:
        return {"series": self.series, "label": self.label, "intensity": self.work.intensity, "flops": self.work.flops,
                "bytes": self.work.bytes, "seconds": self.seconds, "tok_s": self.tok_s,
                "tflops": self.flops_per_s / 1e12, "regime": self.regime(c), "of_roof": self.of_roof(c)}


def measure_ceilings(device: str, dtype: torch.dtype = torch.bfloat16, copy_mib: int | None = None,
                     matmul_n: int | None = None, repeats: int = 10) -> Ceilings:
    """The bandwidth of a device-to-device copy (bytes read + written) and the FLOP/s of an n^3 product,
    the best of `repeats`; 1 GiB and n = 8192 on a GPU, small on a CPU."""
    cuda = device.startswith("cuda")
    copy_mib = copy_mib or (1024 if cuda else 64)
    matmul_n = matmul_n or (8192 if cuda else 512)
    src = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() / _best(lambda: dst.copy_(src), device, repeats)
    compute_dtype = dtype if cuda else torch.float32
    x = torch.randn(matmul_n, matmul_n, device=device).to(compute_dtype)
    y = torch.randn(matmul_n, matmul_n, device=device).to(compute_dtype)
    peak = 2 * matmul_n**3 / _best(lambda: x @ y, device, repeats)
    name = torch.cuda.get_device_name(torch.device(device)) if cuda else "cpu"
    return Ceilings(name, bandwidth, peak, str(compute_dtype).removeprefix("torch."))


def _best(fn, device: str, repeats: int) -> float:  # noqa: ANN001
    cuda = device.startswith("cuda")
    for _ in range(2):
        fn()
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def plot_data(points: list[Point], c: Ceilings, samples: int = 64) -> dict:
    """What the picture draws: the roof sampled over the intensities in view (log-spaced), and each
    series' points (intensity, TFLOP/s, label)."""
    lows = [p.work.intensity for p in points] + [c.ridge]
    lo, hi = min(lows) / 2, max(lows) * 4
    xs = [lo * (hi / lo) ** (k / (samples - 1)) for k in range(samples)]
    series: dict[str, list[tuple[float, float, str]]] = {}
    for p in points:
        series.setdefault(p.series, []).append((p.work.intensity, p.flops_per_s / 1e12, p.label))
    return {"roof": [(x, c.attainable(x) / 1e12) for x in xs], "ridge": c.ridge, "series": series,
            "ceilings": asdict(c)}


def plot(points: list[Point], c: Ceilings, path: Path, title: str) -> str:
    """Write the roofline PNG at `path`; returns what happened, in words (no matplotlib: skipped)."""
    if not points:
        return "roofline: no measured point to draw"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "roofline PNG skipped: matplotlib is not installed here (the table and JSON hold its data)"
    data = plot_data(points, c)
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.loglog([x for x, _ in data["roof"]], [y for _, y in data["roof"]], color="black", lw=2,
              label=f"roof: {c.bandwidth / 1e12:.2f} TB/s, {c.peak_flops / 1e12:.0f} TFLOP/s {c.dtype} (measured)")
    ax.axvline(data["ridge"], color="grey", ls=":", lw=1)
    markers = iter("os^xDv<>")
    for name, pts in data["series"].items():
        ax.loglog([x for x, _, _ in pts], [y for _, y, _ in pts], marker=next(markers, "o"), ls="--", label=name)
        for x, y, label in pts:
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"roofline PNG written: {path.name}"
