"""Launchers of the C++ draws (kernels/cpu/sample_ops.cpp) on the CPU: among top-k candidates, and over
the whole vocabulary. Twins: `reference.sample_top_k_ref` and `reference.sample_full_ref`, the paths on
other devices and where the extension cannot be built (kernels/cpu_ext.py; `TESSERA_CPU_KERNELS=0`).
The whole-vocabulary draw hashes every row's noise (an unseeded row's from a seed the sampler draws):
one number a row instead of an Exp(1) a token, which on the CPU was most of the draw's cost.

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
    mod = _module("sample_top_k", logits)
    return mod.sample_top_k(logits.contiguous(), _as(temperature, torch.float32), int(k), _as(top_k, torch.int64),
                            _as(top_p, torch.float32), _as(min_p, torch.float32), _as(noise, torch.float32),
                            _as(seeds, torch.int64), _as(index, torch.int64))


def sample_full(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                top_p: torch.Tensor | None, min_p: torch.Tensor | None, seeds: torch.Tensor,
                index: torch.Tensor) -> torch.Tensor:
    """`reference.sample_full_ref` for CPU tensors and float32 logits, with every row's noise the hash of
    (seeds [R] >= 0, index [R], token id), computed here at the tokens that need it: the twin's tokens
    for noise = seeded_noise(seeds, index, V). The other tensors are converted to the kernel's dtypes
    where they are not."""
    mod = _module("sample_full", logits)
    return mod.sample_full(logits.contiguous(), _as(temperature, torch.float32), _as(top_k, torch.int64),
                           _as(top_p, torch.float32), _as(min_p, torch.float32), _as(seeds, torch.int64),
                           _as(index, torch.int64))


def _as(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """t in `dtype`, contiguous. Looked at first: a call to `to` costs ~1 µs even when it returns t, and
    the draw at batch 1 takes ~3."""
    if t is None or (t.dtype == dtype and t.is_contiguous()):
        return t
    return t.to(dtype).contiguous()


def _module(op: str, logits: torch.Tensor):  # noqa: ANN202 - the extension module
    """The extension, after the checks both draws share."""
    mod = extension()
    if mod is None:
        raise RuntimeError("cpu kernels: not available on this machine (see the log)")
    if logits.device.type != "cpu":
        raise ValueError(f"{op} (CPU): CPU tensors only")
    if logits.dtype != torch.float32:
        raise ValueError(f"{op} (CPU): float32 logits, got {logits.dtype}")
    return mod
