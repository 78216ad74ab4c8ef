"""Compile every Triton kernel for GPUs this machine does not have: the check before a GPU's minutes are spent.

    python -m benchmarks.gpu_compile [--arch 80,90]

Triton's interpreter (how the kernel tests run here) executes a kernel's Python with numpy, so it never
sees what the compiler sees: a loop-carried variable whose type changes, a dtype a GPU's instruction set
lacks, a constexpr branch that does not type-check. Triton itself compiles to PTX and cubin on any host
(its ptxas ships in the wheel); only loading and launching need a GPU. So this runs the GPU check's kernel
table (benchmarks/gpu_check_kernels.py: every launcher, every kernel, both the model's dtypes and the
FP8 cache, at its tiny and its production shapes) with a stand-in driver that names a target architecture, and with each launch replaced by
Triton's own warm-up (compile, do not launch). A kernel that would not compile on that GPU, or would
need more shared memory than it has, raises here.

It must run in its own process without TRITON_INTERPRET (the kernels are then compiled functions), and
the outputs of the table are garbage (nothing ran): only the compilation is checked. Architectures: 80
(A100), 90 (H100 / H200), 100 (B200), 120 (consumer Blackwell) are what Triton's NVIDIA backend takes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _fake_driver(arch: int):  # noqa: ANN202 - a triton DriverBase
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CompileOnly(DriverBase):
        """The driver Triton asks for the device, stream and target: CUDA `arch`, no stream."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise NotImplementedError

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", arch, 32)

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

        def get_benchmarker(self):  # noqa: ANN201
            raise NotImplementedError

        def get_current_device(self) -> int:
            return arch  # Triton caches its compiled kernels per device: one "device" per architecture

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

    return CompileOnly()


# Shared memory a block may use, by compute capability (CUDA's programming guide): a kernel over it
# compiles but fails to load, so the check compares each compiled kernel's figure with its target's.
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024,
                       120: 99 * 1024}


def compile_all(arch: int) -> tuple[list[str], dict[str, int]]:
    """Every kernel the GPU check's table launches, at its tiny and its production shapes (the tile sizes,
    constexprs, differ), compiled for sm_`arch`: the names compiled, and each kernel's largest shared memory
    in bytes. Raises where one does not compile or
    needs more shared memory than the architecture has."""
    import torch
    import triton
    from triton.runtime.jit import JITFunction

    import kernels._launch as launch
    from benchmarks.gpu_check_kernels import PRODUCTION, TINY, kernel_table

    if launch.interpreting():
        raise RuntimeError("gpu_compile: run without TRITON_INTERPRET (the interpreter compiles nothing)")
    triton.runtime.driver.set_active(_fake_driver(arch))
    compiled: list[str] = []
    shared: dict[str, int] = {}  # the most shared memory each kernel's compilations take, bytes

    def warm_up_instead(self, grid):  # noqa: ANN001, ANN202 - JITFunction.__getitem__'s replacement
        def run(*args, **kwargs):  # noqa: ANN202
            kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            if kernel.metadata.target.arch != arch:
                raise RuntimeError(f"{self.fn.__name__}: compiled for sm_{kernel.metadata.target.arch}, not sm_{arch}")
            limit = SHARED_MEMORY_LIMIT.get(arch)
            if limit is not None and kernel.metadata.shared > limit:
                raise RuntimeError(f"{self.fn.__name__}: {kernel.metadata.shared} bytes of shared memory, sm_{arch} "
                                   f"has {limit}")
            compiled.append(self.fn.__name__)
            shared[self.fn.__name__] = max(shared.get(self.fn.__name__, 0), kernel.metadata.shared)
        return run

    original_getitem, original_interpreting = JITFunction.__getitem__, launch.interpreting
    JITFunction.__getitem__ = warm_up_instead
    launch.interpreting = lambda: True  # the launchers' device check: CPU tensors stand in for CUDA ones
    try:
        for shapes in (TINY, PRODUCTION):
            kernel_table(shapes, "cpu", dtypes=(torch.float32, torch.bfloat16))
        _variants()
    finally:
        JITFunction.__getitem__, launch.interpreting = original_getitem, original_interpreting
    return compiled, shared


def _variants() -> None:
    """Constexpr branches the table does not reach: flash-decoding's split and merge kernels (both cache
    layouts), and the whole-vocabulary draw with each of top-k, top-p and min-p alone and with none."""
    import torch

    from kernels import kv_fp8
    from kernels.paged_attention import paged_decode_attention
    from kernels.sample_full import sample_full

    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(2, 4, 16).to(dtype)
        cache = torch.randn(8, 16, 2, 16).to(dtype)
        tables, lens = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32), torch.tensor([60, 33], dtype=torch.int32)
        paged_decode_attention(q, cache, cache, tables, lens, 0.25, num_splits=2)
        fp8 = kv_fp8.quantize(cache.float())
        paged_decode_attention(q, fp8, fp8, tables, lens, 0.25, num_splits=2)
    rows = 4
    logits, temperature = torch.randn(rows, 1000), torch.ones(rows)
    seeds, index = torch.arange(rows), torch.zeros(rows, dtype=torch.long)
    k, p, m = torch.full((rows,), 5), torch.full((rows,), 0.9), torch.full((rows,), 0.1)
    for top_k, top_p, min_p in ((None, None, None), (k, None, None), (None, p, None), (None, None, m)):
        sample_full(logits, temperature, top_k, top_p, min_p, seeds, index)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="80,90", help="comma-separated CUDA compute capabilities, e.g. 80,90,100")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("gpu_compile: unset TRITON_INTERPRET first", file=sys.stderr)
        return 2
    for arch in (int(a) for a in args.arch.split(",")):
        start = time.perf_counter()
        names, shared = compile_all(arch)
        most = max(shared, key=shared.get)
        print(f"sm_{arch}: {len(names)} launches compiled ({len(set(names))} kernels) in "
              f"{time.perf_counter() - start:.0f} s, the most shared memory {shared[most] / 1024:.0f} KiB ({most}): "
              f"{', '.join(sorted(set(names)))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
