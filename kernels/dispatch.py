"""One switch between the Triton kernels and their torch twins.

``use_triton(device)``: on a CUDA device with triton importable, the kernels; on the CPU,
the references. ``TESSERA_KERNELS=triton|torch|auto`` (default auto) forces either; forcing
triton on the CPU only works under ``TRITON_INTERPRET=1`` (for testing, it is slow).

The kernel modules are imported on first use, never at import of this module, so the CPU
engine does not need triton installed, and a test can set TRITON_INTERPRET before they load.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from kernels import reference
from kernels._launch import interpreting

log = logging.getLogger(__name__)

MODES = ("auto", "triton", "torch")


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401  (lazy: triton is absent from CPU-only installs)
    except ImportError:
        return False
    return True


def kernels_mode() -> str:
    mode = os.environ.get("TESSERA_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"TESSERA_KERNELS={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def use_triton(device: torch.device | str) -> bool:
    """Whether ops on `device` run the Triton kernels (True) or the torch references (False)."""
    device = torch.device(device)
    mode = kernels_mode()
    if mode == "torch":
        return False
    if mode == "auto":
        return device.type == "cuda" and triton_available()
    if not triton_available():
        raise RuntimeError("TESSERA_KERNELS=triton but triton is not importable (install the 'gpu' extra)")
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(f"TESSERA_KERNELS=triton on a {device.type} device needs TRITON_INTERPRET=1 "
                           "(Triton compiles for GPUs only; the interpreter is for tests)")
    return True


def _pick(module: str, name: str, device: torch.device) -> Callable[..., Any]:
    if use_triton(device):
        return getattr(importlib.import_module(f"kernels.{module}"), name)
    return getattr(reference, f"{name}_ref")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _pick("rms_norm", "rms_norm", x.device)(x, weight, eps, residual)


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                     sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _pick("rotary", "rotary_embedding", q.device)(q, k, positions, cos_cache, sin_cache)


def rotary_write_kv(qkv: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor, slots: torch.Tensor, heads: int,
                    kv_heads: int) -> torch.Tensor:
    fn = _pick("rotary_kv", "rotary_write_kv", qkv.device)
    return fn(qkv, positions, cos_cache, sin_cache, key_cache, value_cache, slots, heads, kv_heads)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _pick("silu_and_mul", "silu_and_mul", x.device)(x)


def paged_decode_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    fn = _pick("paged_attention", "paged_decode_attention", q.device)
    return fn(q, key_cache, value_cache, block_tables, context_lens, scale)


def prefill_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                      scale: float, *, max_seqlen_q: int | None = None) -> torch.Tensor:
    fn = _pick("prefill_attention", "prefill_attention", q.device)
    return fn(q, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens, scale,
              max_seqlen_q=max_seqlen_q)


def sgmv_shrink(x: torch.Tensor, lora_a: torch.Tensor, scaling: torch.Tensor, seg_indptr: torch.Tensor,
                seg_lora_ids: torch.Tensor, *, max_seg_len: int | None = None) -> torch.Tensor:
    fn = _pick("lora_shrink", "sgmv_shrink", x.device)
    return fn(x, lora_a, scaling, seg_indptr, seg_lora_ids, max_seg_len=max_seg_len)


def sgmv_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor, seg_indptr: torch.Tensor,
                seg_lora_ids: torch.Tensor, col_offset: int = 0, *, max_seg_len: int | None = None) -> torch.Tensor:
    fn = _pick("lora_expand", "sgmv_expand", y.device)
    return fn(y, buf, lora_b, seg_indptr, seg_lora_ids, col_offset, max_seg_len=max_seg_len)


def bgmv_shrink(x: torch.Tensor, lora_a: torch.Tensor, scaling: torch.Tensor,
                token_lora_ids: torch.Tensor) -> torch.Tensor:
    return _pick("lora_shrink", "bgmv_shrink", x.device)(x, lora_a, scaling, token_lora_ids)


def bgmv_expand(y: torch.Tensor, buf: torch.Tensor, lora_b: torch.Tensor, token_lora_ids: torch.Tensor,
                col_offset: int = 0) -> torch.Tensor:
    return _pick("lora_expand", "bgmv_expand", y.device)(y, buf, lora_b, token_lora_ids, col_offset)


def awq_gemm(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
             group_size: int = 128) -> torch.Tensor:
    return _pick("awq_gemm", "awq_gemm", x.device)(x, qweight, qzeros, scales, group_size)


@functools.cache
def _note_w8a8_fallback(device: str) -> None:
    log.info("fp8_w8a8_unavailable", extra={"device": device, "fallback": "weight-only fp8",
                                            "reason": "needs CUDA compute capability >= 8.9"})


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, *,
               quantize_activations: bool = False) -> torch.Tensor:
    """Weight-only FP8, or W8A8 when asked for and the device has FP8 tensor cores.

    W8A8 elsewhere falls back to weight-only (logged once per device): the same weights, a
    little more accurate, slower only where FP8 tensor cores would have helped.
    """
    if quantize_activations and x.device.type == "cuda":
        from kernels.fp8_gemm import fp8_w8a8_linear, w8a8_supported  # lazy: imports triton, CUDA only

        if w8a8_supported(x.device):
            return fp8_w8a8_linear(x, weight, weight_scale)
    if quantize_activations:
        _note_w8a8_fallback(str(x.device))
    return _pick("fp8_gemm", "fp8_linear", x.device)(x, weight, weight_scale)
