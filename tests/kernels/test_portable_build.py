"""The CPU kernels' portable loops, the ones an ARM or AVX2-less x86 host runs: `-march=native` never
compiles them on an x86 CI host, so they are built here for a target without AVX2 and put through the
same kernel tests as the vectorized build."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="elsewhere the native build is the portable one"),
]

ROOT = Path(__file__).resolve().parents[2]
PORTABLE = "x86-64-v2"  # SSE4.2, no AVX2: the extension's `#else` branches


def test_the_portable_loops_pass_the_kernel_tests(tmp_path):
    env = {**os.environ, "TESSERA_CPU_ARCH": PORTABLE, "TESSERA_CACHE_DIR": str(tmp_path)}
    probe = subprocess.run(
        [sys.executable, "-c", "from kernels import cpu_decode, gguf_cpu; "
                               "print(gguf_cpu.available(), cpu_decode.available(), gguf_cpu.vectorized())"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert probe.stdout.split() == ["True", "True", "False"], probe.stdout + probe.stderr[-2000:]
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/kernels/test_gguf_decoder.py", "tests/kernels/test_cpu_kernels.py",
         "tests/kernels/test_kv_fp8.py", "tests/kernels/test_gguf_decoder_fp8.py",  # FP8 KV: the scalar table
         "tests/kernels/test_cpu_sample.py",  # the top-p mass's scalar exponentials
         "-k", "not vectorized_paths"],  # the one test that asks for AVX2
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and " failed" not in tests.stdout
