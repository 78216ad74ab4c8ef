"""Launcher of the C++ top-k draw (kernels/cpu/sample_ops.cpp) on the CPU. Twin:
`reference.sample_top_k_ref`, the path on other devices and where the extension cannot be built
(kernels/cpu_ext.py; `TESSERA_CPU_KERNELS=0` turns it off).

Same tokens as the twin for the same inputs, except where two candidates' weight / noise ratios
agree to float rounding (the exponentials are computed in a different order and library) or logits
tie exactly (the twin's `topk` order is unspecified; here the lower token id ranks first).
"""

from __future__ import annotations

import torch

from kernels.cpu_ext import extension


def available() -> bool:
    return extension() is not None


def sample_top_k(logits: torch.Tensor, temperature: torch.Tensor, k: int, top_k: torch.Tensor | None,
                 top_p: torch.Tensor | None, min_p: torch.Tensor | None, noise: torch.Tensor,
                 seeds: torch.Tensor | None, index: torch.Tensor | None) -> torch.Tensor:
    """`reference.sample_top_k_ref` for CPU tensors and float32 logits (the other tensors are taken in
    the kernel's dtypes, converted where they are not)."""
    mod = extension()
    if mod is None:
        raise RuntimeError("cpu kernels: not available on this machine (see the log)")
    if logits.device.type != "cpu":
        raise ValueError("sample_top_k (CPU): CPU tensors only")
    if logits.dtype != torch.float32:
        raise ValueError(f"sample_top_k (CPU): float32 logits, got {logits.dtype}")
    def as_(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:  # no copy when it already is
        return None if t is None else t.to(dtype).contiguous()

    return mod.sample_top_k(logits.contiguous(), as_(temperature, torch.float32), int(k), as_(top_k, torch.int64),
                            as_(top_p, torch.float32), as_(min_p, torch.float32), as_(noise, torch.float32),
                            as_(seeds, torch.int64), as_(index, torch.int64))
