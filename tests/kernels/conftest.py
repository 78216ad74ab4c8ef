"""Kernel tests run the real Triton kernels on the CPU, in Triton's interpreter.

Triton decides between compiling and interpreting when ``@triton.jit`` runs: for its own
helpers when triton is imported, for ours when a kernels/ module is imported. So the variable
is set here, before the test modules import them, and a triton or kernel module imported
earlier (by another package's tests) is imported afresh.

Two interpreter gaps are filled for the duration of the tests (Triton 3.9), so that the
interpreter computes what the GPU computes:

- ``tl.dot`` on bfloat16 multiplies the raw uint16 bit patterns (triton-lang/triton#11584,
  closed as unsupported); we convert bfloat16 operands to float32 first, which is what a
  tensor core does (exact products, float32 accumulation).
- float32 → bfloat16 casts truncate; GPUs round to nearest even, and so do we here.

Bfloat16 elementwise arithmetic is broken in the interpreter too; the kernels never do it
(they upcast to float32 first, which is also what the GPU does internally).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import importlib  # noqa: E402
import sys  # noqa: E402


def _forget_compiled_triton() -> None:
    """Drop a triton imported before this file (transformers' model imports pull it in).

    triton.language's own helpers (tl.sum, tl.max, ...) were wrapped as compiled functions at
    that import and cannot run in the interpreter; a fresh import wraps them for it. Modules
    that already hold the old triton keep it, which is harmless: they never see our tensors.
    """
    language = sys.modules.get("triton.language")
    if language is None or type(language.sum).__name__ != "JITFunction":
        return
    # The compiled extension stays: it cannot be initialized twice, and it holds no such state.
    stale = [n for n in sys.modules if n.split(".")[0] == "triton" and not n.startswith("triton._C")]
    for name in stale:
        del sys.modules[name]


_forget_compiled_triton()

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


def _bf16_to_f32(data: np.ndarray) -> np.ndarray:
    return (data.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_rne(data: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(data), np.uint16(0x7FC0), rounded)


_original_create_dot = interpreter.InterpreterBuilder.create_dot
_original_cast_impl = interpreter.InterpreterBuilder.cast_impl


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if a.dtype.scalar == tl.bfloat16:
        a = interpreter.TensorHandle(_bf16_to_f32(a.data), tl.float32)
    if b.dtype.scalar == tl.bfloat16:
        b = interpreter.TensorHandle(_bf16_to_f32(b.data), tl.float32)
    return _original_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)


def _cast_impl(self, src, dst_type):
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        return interpreter.TensorHandle(_f32_to_bf16_rne(src.data), tl.bfloat16)
    return _original_cast_impl(self, src, dst_type)


interpreter.InterpreterBuilder.create_dot = _create_dot
interpreter.InterpreterBuilder.cast_impl = _cast_impl


def _reimport_compiled_kernel_modules() -> None:
    for name, module in list(sys.modules.items()):
        # By name: a kernel compiled against a triton dropped above has that triton's class.
        if name.startswith("kernels.") and any(
            type(value).__name__ == "JITFunction" for value in vars(module).values()
        ):
            importlib.reload(module)


_reimport_compiled_kernel_modules()
