"""The CPU kernels' C++ extension (kernels/cpu/*.cpp), compiled on first use and cached.

Torch's extension builder compiles them (g++ and ninja; about 30 s once, more on a busy host) for
this CPU (`-march=native`; ``TESSERA_CPU_ARCH`` names another target, e.g. ``x86-64-v2`` to build
the portable loops an AVX2-less or ARM host runs) into ``TESSERA_CACHE_DIR`` (default
~/.cache/tessera)/cpu_kernels/<tag>, where the tag hashes the CPU's model and flags, the target, the
sources, their directory and torch's version:
a cache shared between different hosts never runs instructions one of them lacks, and an edited
source rebuilds. Where no compiler, headers or ninja are found, or ``TESSERA_CPU_KERNELS=0``,
``extension()`` is None and says why once in the log; every caller then keeps its torch path.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent / "cpu"
SOURCES = ("bindings.cpp", "gguf_matmul.cpp", "decode_ops.cpp", "gguf_decoder.cpp", "sample_ops.cpp")
_lock = threading.Lock()


def _arch() -> str:
    return os.environ.get("TESSERA_CPU_ARCH") or "native"


def _tag() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "model name", "Features")):
                cpu += line
            if line.startswith(("flags", "Features")):
                break
    except OSError:
        cpu = os.uname().machine
    digest = hashlib.sha256(cpu.encode())
    digest.update(_arch().encode())
    # and the checkout: torch's builder names the sources by path in its build file, so two checkouts
    # sharing one directory would rebuild it for each other, 30-80 s every time
    digest.update(str(SOURCE_DIR).encode())
    for path in sorted(SOURCE_DIR.glob("*.[ch]*")):  # the sources and every header they include
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    root = os.environ.get("TESSERA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tessera")
    return Path(root) / "cpu_kernels" / _tag()


@functools.cache
def extension() -> ModuleType | None:
    """The loaded extension module, or None where it cannot be built here (logged once)."""
    if os.environ.get("TESSERA_CPU_KERNELS", "1") == "0":
        log.info("C++ CPU kernels turned off (TESSERA_CPU_KERNELS=0)")
        return None
    from torch.utils import (
        cpp_extension,  # lazy: setuptools and the compiler's wrappers, only when built or loaded
    )

    build = build_dir()
    # ninja is looked up on PATH; a venv's own copy (the `ninja` package) sits beside the interpreter.
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    try:
        build.mkdir(parents=True, exist_ok=True)
        with _lock:  # threads of one process; torch's builder locks the directory between processes
            return cpp_extension.load(
                name="tessera_cpu_kernels", sources=[str(SOURCE_DIR / n) for n in SOURCES],
                build_directory=str(build), verbose=False,
                # -fopenmp: at::parallel_for is a header template; without it every loop runs on one thread.
                extra_cflags=["-O3", f"-march={_arch()}", "-fopenmp"], extra_ldflags=["-fopenmp"])
    except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, no headers: callers keep their torch path
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        log.warning("C++ CPU kernels unavailable (%s: %s); the torch paths run instead", type(exc).__name__, first)
        return None
