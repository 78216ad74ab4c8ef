"""Argument checks and small helpers shared by the Triton launchers.

Every launcher validates before it launches: a bad stride or dtype inside a kernel is
silent memory corruption on a GPU, so the checks are worth their microseconds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32,)


def fail(op: str, message: str) -> None:
    raise ValueError(f"{op}: {message}")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_tensor(
    op: str,
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    last_dim_contiguous: bool = True,
    contiguous: bool = False,
) -> torch.Tensor:
    """Type, rank, dtype and stride checks with messages that name the op and argument."""
    if not isinstance(t, torch.Tensor):
        fail(op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    assert isinstance(t, torch.Tensor)
    if ndim is not None and t.dim() != ndim:
        fail(op, f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        fail(op, f"{name} must have dtype in ({names}), got {str(t.dtype).removeprefix('torch.')}")
    if contiguous and not t.is_contiguous():
        fail(op, f"{name} must be contiguous (strides {t.stride()} for shape {tuple(t.shape)})")
    if last_dim_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, f"{name} must have unit stride in its last dimension, got strides {t.stride()}")
    return t


def check_shape(op: str, name: str, t: torch.Tensor, expected: Sequence[int | None]) -> None:
    """`expected` uses None for a free dimension."""
    ok = t.dim() == len(expected) and all(e is None or e == s for e, s in zip(expected, t.shape, strict=True))
    if not ok:
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        fail(op, f"{name} must have shape {want}, got {list(t.shape)}")


def check_same_dtype(op: str, **tensors: torch.Tensor) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        fail(op, "dtypes must match: " + ", ".join(f"{n}={str(d).removeprefix('torch.')}" for n, d in dtypes.items()))


def check_devices(op: str, tensors: Iterable[tuple[str, torch.Tensor | None]]) -> None:
    """All on one device, and that device is a GPU (or the CPU under TRITON_INTERPRET=1)."""
    present = [(n, t) for n, t in tensors if t is not None]
    devices = {t.device for _, t in present}
    if len(devices) > 1:
        fail(op, "tensors are on different devices: " + ", ".join(f"{n}={t.device}" for n, t in present))
    device = next(iter(devices))
    if device.type == "cpu" and not interpreting():
        fail(op, "the Triton kernel needs CUDA tensors; on the CPU use kernels.reference "
                 "(or set TRITON_INTERPRET=1 to run the kernel in Triton's interpreter)")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def dot_block(n: int, cap: int | None = None) -> int:
    """A power-of-two tile for a tl.dot operand: GPU tensor-core dots need every dimension >= 16."""
    block = max(16, next_pow2(n))
    return block if cap is None else min(block, cap)


def dot_precision(dtype: torch.dtype) -> str:
    """float32 inputs get IEEE dots: the TF32 default would make fp32 results differ by ~1e-3."""
    return "ieee" if dtype == torch.float32 else "tf32"
