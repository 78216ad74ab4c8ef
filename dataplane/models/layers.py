"""Small building blocks of the decoder: projections, RMSNorm, rotary embeddings, SwiGLU."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from dataplane.cpu_features import cpu_has_native_bf16
from kernels import dispatch


class Linear:
    """A dense projection y = x W^T. Quantized layers (dataplane/quant) offer the same call.

    float32 on the CPU, and bf16 on a CPU with native bf16, run through a prepacked weight, and the
    dense weight is then not kept (`weight` rebuilds it on demand): oneDNN's packing (`_onednn_pack`),
    or with `storage=torch.float16` FBGEMM's float16 packing (`_fp16_pack`: half the bytes, float32
    maths)."""

    __slots__ = ("_weight", "_packed", "_fp16", "out_features", "in_features", "_element_size", "_dtype")

    def __init__(self, weight: torch.Tensor, *, storage: torch.dtype | None = None) -> None:
        self.out_features, self.in_features = weight.shape  # weight: [out_features, in_features]
        if storage not in (None, weight.dtype, torch.float16):
            raise ValueError(f"Linear: {storage} storage is not supported (float16 under float32, or None)")
        self._packed = _fp16_pack(weight) if storage == torch.float16 and weight.dtype != torch.float16 else None
        self._fp16 = self._packed is not None
        if self._packed is None:
            self._packed = _onednn_pack(weight)
        self._element_size = 2 if self._fp16 else weight.element_size()
        self._dtype = weight.dtype
        self._weight = None if self._packed is not None else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._fp16:
            return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)
        if self._packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        return F.linear(x, self._weight)

    @property
    def weight(self) -> torch.Tensor:
        """[out_features, in_features] in the compute dtype; a fresh copy when the weight is kept
        prepacked (with float16 storage, the float16-rounded values the layer computes with)."""
        if self._fp16:
            return torch.ops.quantized.linear_unpack_fp16(self._packed)[0]
        return self._packed.to_dense() if self._packed is not None else self._weight

    @property
    def packed(self) -> bool:
        return self._packed is not None

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype the weight's bytes are kept in."""
        if self._fp16:
            return torch.float16
        return self._dtype

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether this layer computes on `tensor` itself (a tied embedding), not a copy of it."""
        return self._weight is tensor

    @property
    def weight_bytes(self) -> int:
        return self.out_features * self.in_features * self._element_size


# float16's largest finite value: a weight beyond it would saturate, so such a layer stays float32.
_FP16_MAX = 65504.0


def _fp16_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """FBGEMM's packed float16 copy of a float32 CPU weight, or None where it does not apply.

    Why: a CPU decode step reads every weight once, so at small batches it runs at memory speed.
    FBGEMM keeps the weight in float16 and widens it in registers (F16C), so the maths stays
    float32 on half the bytes: a decode step's linears ran 2.1x faster than oneDNN float32 at M = 1
    and 1.2x at M = 32 on an AVX2 EPYC (benchmarks/results/linear_cpu.md), where bf16 is emulated
    and slower still. Rounding to float16 costs 2^-11 relative per weight, 8x finer than bf16."""
    if (weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2
            or not hasattr(torch.ops.quantized, "linear_prepack_fp16")):
        return None
    if not bool(torch.isfinite(weight).all()) or float(weight.abs().max()) > _FP16_MAX:
        return None
    try:
        return torch.ops.quantized.linear_prepack_fp16(weight.contiguous(), None)
    except (RuntimeError, AttributeError):  # no FBGEMM here (not x86, or no AVX2): float32 packing
        return None


# Batch-size hint for oneDNN's weight layout. Streaming 40 weights of 3072 x 576 (AVX2 EPYC, 2
# threads, a busy moment), per weight at M = 1 / 4 / 32: hint 1 gave 794 / 1510 / 2730 us, hint 8
# 521 / 1142 / 2826 us, hint 32 1022 / 1226 / 2617 us. Noisy, no clear winner at 32; 8 was best at
# the small decode batches a CPU worker mostly runs.
PACK_BATCH_HINT = 8


def _onednn_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's prepacked float32 weight, or None where it does not apply.

    Why: torch's float32 `F.linear` goes to MKL's sgemm, which on the AVX2 EPYC this was measured on
    ran small-M products at a fraction of the memory bandwidth; oneDNN on the same prepacked weight
    (the path Inductor takes for frozen CPU linears) ran a decode step's linears 1.6x faster at
    M = 1, 2.5x at M = 4 and 1.5x at M = 32, and whole engine steps 1.24x faster at batch 1 and 32
    (benchmarks/results/linear_cpu.md). bf16 `F.linear` goes through oneDNN too, but reorders the
    plain weight on every call: on an AVX-512 BF16 EPYC (one thread, SmolLM2's 30 layers x 4
    projections streamed from memory) the prepacked bf16 weights took 7.8-10.9 ms per batch-1 step
    against 17.5-34 ms, the 49152 x 576 lm head 1.5 against 3.3 ms, and at M = 32 22-28 against
    28-38 ms (`python -m benchmarks.decode_latency`). Where bf16 is emulated (AVX2) it stays plain.
    TESSERA_ONEDNN_LINEAR=0 turns it off."""
    if (weight.dtype not in (torch.float32, torch.bfloat16) or weight.device.type != "cpu" or weight.dim() != 2
            or os.environ.get("TESSERA_ONEDNN_LINEAR", "1") == "0" or not torch.backends.mkldnn.is_available()):
        return None
    if weight.dtype == torch.bfloat16 and not cpu_has_native_bf16():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT)
    except (RuntimeError, AttributeError):  # a build or CPU without this path: plain F.linear
        return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # One fused op; for bf16 input torch accumulates in fp32 internally.
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def interleave_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder each head's q/k projection rows from rotate_half pairs (i, i + D/2) to adjacent pairs.

    q . k is unchanged by one permutation applied to both, and adjacent pairs let the rotation run
    as a single complex multiply (3 ops per layer instead of 7 on the CPU's per-op-bound path).
    """
    rows, cols = weight.shape
    d = rows // num_heads
    perm = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()
    return weight.view(num_heads, d, cols)[:, perm, :].reshape(rows, cols)


class Rotary:
    """Rotary position embedding over adjacent (interleaved) pairs, as complex multiplication.

    The loader stores q/k rows interleaved (interleave_rotary_rows), which is equivalent to
    Hugging Face's rotate_half form on the original layout.
    """

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: float,
                 device: torch.device) -> None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        t = torch.arange(max_position, dtype=torch.float32) / scaling
        freqs = torch.outer(t, inv_freq)  # [max_pos, D/2]
        self.cis = torch.polar(torch.ones_like(freqs), freqs).to(device)  # complex64
        self.cos_sin = torch.view_as_real(self.cis).contiguous()  # [max_pos, D/2, 2] float32, for the C++ op

    def tables(self, positions: torch.Tensor) -> torch.Tensor:
        """Rotations for this step's positions, broadcasting over heads: [T, 1, D/2] complex."""
        return self.cis[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] -> rotated copy in x's dtype."""
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * cis).flatten(-2).to(x.dtype)

    # The decoder's interface: prepare once per step (as NeoxRotary), rotate once per layer.
    prepare = tables

    @staticmethod
    def rotate(qkv: torch.Tensor, cis: torch.Tensor, heads: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D] and k [T, Hkv, D] rotated from a fused qkv output [T, (H + 2 Hkv) D]."""
        n, d = qkv.shape[0], qkv.shape[1] // (heads + 2 * kv_heads)
        # q and k are adjacent in the fused output: rotate both with one call.
        qk = Rotary.apply(qkv[:, : (heads + kv_heads) * d].view(n, heads + kv_heads, d), cis)
        return qk[:, :heads], qk[:, heads:]


class NeoxRotary:
    """Hugging Face's rotate_half rotary over q/k rows in the checkpoint's order, via kernels.dispatch.

    The layout where the Triton kernels run (CUDA): the kernels read q and k as strided views of the
    fused qkv output, so nothing is permuted at load. Its decoder rotates and writes the KV cache in one
    launch a layer (`rotate_write_kv`: kernels/rotary_kv.py).
    """

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: float,
                 device: torch.device) -> None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32) / scaling, inv_freq)
        self.cos = freqs.cos().to(device).contiguous()  # [max_pos, D/2] float32
        self.sin = freqs.sin().to(device).contiguous()

    @staticmethod
    def prepare(positions: torch.Tensor) -> torch.Tensor:
        return positions

    def rotate_write_kv(self, qkv: torch.Tensor, positions: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
        """q [T, H, D] rotated, with k rotated and v stored at `slots` of the caches (not returned)."""
        return dispatch.rotary_write_kv(qkv, positions, self.cos, self.sin, key_cache, value_cache, slots,
                                        heads, kv_heads)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
