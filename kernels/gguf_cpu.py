"""CPU matmuls on weights kept in GGUF's Q4_1 / Q8_0 blocks (kernels/cpu/gguf_matmul.cpp).

The weights come in kernels/gguf_layout.py's row layout (`repack_q4_1` / `repack_q8_0` of the
file's blocks). The C++ is compiled on first use (kernels/cpu_ext.py); where it cannot be,
``available()`` is False and callers dequantize instead.

Launchers check shapes and dtypes; `kernels.reference.gguf_q4_1_linear_ref` and
`gguf_q8_0_linear_ref` are the torch twins of the same signature.
"""

from __future__ import annotations

import torch

from kernels.cpu_ext import extension
from kernels.gguf_layout import Q4_1_BLOCK_BYTES, Q8_0_BLOCK_BYTES, QK


def available() -> bool:
    """Whether the compiled kernels load on this machine (compiles them on the first call)."""
    return extension() is not None


def vectorized() -> bool:
    """Whether the build has the AVX2 path (False: the portable scalar loop, correct but slow)."""
    mod = extension()
    return bool(mod is not None and mod.vectorized())


def raw_op(fmt: str):
    """The compiled function for "Q4_1" or "Q8_0" (x, packed, out_features, in_features), without the
    Python checks: for layers that checked their weights once at construction (it still checks shapes)."""
    mod = extension()
    if mod is None:
        raise RuntimeError("gguf kernels: not available on this machine (see the log)")
    return mod.q4_1_linear if fmt == "Q4_1" else mod.q8_0_linear


def _check(x: torch.Tensor, blocks: torch.Tensor, out_features: int, in_features: int, block_bytes: int) -> None:
    if x.device.type != "cpu" or blocks.device.type != "cpu":
        raise ValueError("gguf kernels: CPU tensors only")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"gguf kernels: x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"gguf kernels: x must be [rows, {in_features}], got {list(x.shape)}")
    if in_features % QK:
        raise ValueError(f"gguf kernels: in_features must be a multiple of {QK}, got {in_features}")
    expected = (out_features, in_features // QK * block_bytes)
    if blocks.dtype != torch.uint8 or tuple(blocks.shape) != expected or not blocks.is_contiguous():
        raise ValueError(f"gguf kernels: blocks must be contiguous uint8 {list(expected)}, "
                         f"got {blocks.dtype} {list(blocks.shape)}")


def q4_1_linear(x: torch.Tensor, blocks: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """y [rows, out] = x W^T, W as Q4_1 rows uint8 [out, in / 32 * 20] in gguf_layout's kernel layout."""
    _check(x, blocks, out_features, in_features, Q4_1_BLOCK_BYTES)
    mod = extension()
    if mod is None:
        raise RuntimeError("gguf kernels: not available on this machine (see the log)")
    return mod.q4_1_linear(x, blocks, out_features, in_features)


def q8_0_linear(x: torch.Tensor, blocks: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """y [rows, out] = x W^T, W as Q8_0 rows uint8 [out, in / 32 * 34] in gguf_layout's kernel layout."""
    _check(x, blocks, out_features, in_features, Q8_0_BLOCK_BYTES)
    mod = extension()
    if mod is None:
        raise RuntimeError("gguf kernels: not available on this machine (see the log)")
    return mod.q8_0_linear(x, blocks, out_features, in_features)


def decoder(projections: list[torch.Tensor], formats: list[str], input_norms: list[torch.Tensor],
            post_norms: list[torch.Tensor], cos_sin: torch.Tensor, *, heads: int, kv_heads: int, head_dim: int,
            eps: float, scale: float):
    """A whole decode step of a Llama decoder as one call (kernels/cpu/gguf_decoder.cpp).

    `projections`: per layer, in order, the qkv, o, gate_up and down blocks (kernel layout, rows of
    q and k interleaved for adjacent-pair rotary as models/layers.Rotary takes them), `formats` their
    "Q4_1" / "Q8_0"; norms per layer; `cos_sin` [max_pos, head_dim / 2, 2] float32 (Rotary.cos_sin).
    The result's `forward(h, positions, slots, block_tables, context_lens, key_caches, value_caches)`
    takes the embedded rows h [S, hidden] of S decode queries (one per sequence), writes their K/V at
    `slots` and returns the residual stream after the last layer, in h's dtype. Its twin is the per-op
    path of dataplane/models/llama.py."""
    mod = extension()
    if mod is None:
        raise RuntimeError("gguf kernels: not available on this machine (see the log)")
    unknown = sorted(set(formats) - {"Q4_1", "Q8_0"})
    if unknown:
        raise ValueError(f"gguf decoder: formats {unknown} are not supported; use Q4_1 or Q8_0")
    return mod.GgufDecoder(list(projections), [1 if f == "Q4_1" else 0 for f in formats], list(input_norms),
                           list(post_norms), cos_sin, heads, kv_heads, head_dim, float(eps), float(scale))
