"""Every Triton kernel compiles for the GPUs we deploy on, on this GPU-less host (benchmarks/gpu_compile.py).

The interpreter tests run a kernel's Python with numpy and miss what only the compiler checks: a kernel
whose loop-carried index turned int64 passed every interpreter test and failed here ("Loop-carried
variable choice has initial type int32 but is re-assigned to int64"). Compiling to cubin for sm_80 and
sm_90 (ptxas ships with Triton) catches that before a lent GPU's minutes go to it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~15 s a target with a cold Triton cache
def test_every_kernel_compiles_for_a100_and_h100():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_compile", "--arch", "80,90"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kernels = set()
    for path in (ROOT / "kernels").glob("*.py"):
        kernels |= set(re.findall(r"@triton\.jit\s*\ndef (_\w+_kernel)\(", path.read_text()))
    assert len(kernels) >= 14
    for arch in (80, 90):
        line = next(line for line in proc.stdout.splitlines() if line.startswith(f"sm_{arch}:"))
        missing = {k for k in kernels if k not in line}
        assert not missing, f"sm_{arch}: never launched by the check, so never compiled: {sorted(missing)}"


def test_the_check_refuses_to_run_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_compile", "--arch", "90"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "unset TRITON_INTERPRET" in proc.stderr
