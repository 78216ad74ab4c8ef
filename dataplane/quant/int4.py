"""4-bit weights with group-wise scales and zero points (AWQ's format), kept packed in memory.

CPU: PyTorch's native packed-int4 matmul (the one torchao uses on the CPU). Its weight packing
comes from _convert_weight_to_int4pack_for_cpu(int32 [N, K] values 0..15, inner_k_tiles) and its
dequantization is w = (q - 8) · scale + zero per group, from a [K/G, N, 2] tensor of (scale,
zero) in the activation dtype. AWQ's w = (q - z) · s is the same line with zero = (8 - z) · s.
CUDA: the AWQ triple stays as loaded and runs through the Triton AWQ GEMM.

Measured on this machine (one thread, bf16, group 32/64): the int4 matmul beats dense bf16 at
batch 1 by 2.5-7x (1536x576: 40 vs 94 us; lm head 49152x576: 1.1 vs 8-11 ms) and loses at batch
32 by about 2.3x (1536x576: 468 vs 211 us): it is built for memory-bound decode.
"""

from __future__ import annotations

import torch

from dataplane.quant.base import as_rows, tensor_bytes
from kernels import dispatch
from kernels.awq_layout import awq_dequantize, awq_quantize, awq_unpack

_INNER_K_TILES = 8  # torchao's default; the CPU packing ignores the tiling hint beyond validating it


class Int4Linear:
    """y = x W^T with W stored as 4-bit groups along the input dimension."""

    def __init__(
        self,
        qweight: torch.Tensor,
        qzeros: torch.Tensor,
        scales: torch.Tensor,
        group_size: int,
        *,
        dtype: torch.dtype = torch.bfloat16,
        dense_above: int = 0,
    ) -> None:
        """From an AutoAWQ GEMM triple: qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N].

        dense_above > 0 keeps a dense copy in `dtype` (opt-in: memory grows from 1/4 to 5/4 of
        bf16) and uses it for inputs of more than that many rows, where the packed CPU matmul
        loses (see the module docstring). 0 keeps only the packed weights.
        """
        in_features, out_features = qweight.shape[0], qweight.shape[1] * 8
        if in_features % group_size or scales.shape != (in_features // group_size, out_features):
            raise ValueError(f"Int4Linear: scales {list(scales.shape)} do not match in_features {in_features}, "
                             f"out_features {out_features} and group_size {group_size}")
        if qzeros.shape != (in_features // group_size, out_features // 8):
            raise ValueError(f"Int4Linear: qzeros must be [{in_features // group_size}, {out_features // 8}], "
                             f"got {list(qzeros.shape)}")
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.dtype = group_size, dtype
        self.packed: torch.Tensor | None = None  # CPU: uint8 [N, K/2] in the CPU op's layout
        self.scales_and_zeros: torch.Tensor | None = None  # CPU: [K/G, N, 2]
        self.awq: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # CUDA: the triple
        self.dense_above = dense_above
        self._dense: torch.Tensor | None = None  # opt-in dense copy for large batches (CPU)
        if qweight.device.type == "cuda":
            self.awq = (qweight.contiguous(), qzeros.contiguous(), scales.contiguous())
            return
        if out_features % 16:
            raise ValueError(f"Int4Linear: the CPU int4 matmul needs out_features divisible by 16, got {out_features}")
        if group_size not in (32, 64, 128, 256):
            raise ValueError(f"Int4Linear: the CPU int4 matmul supports group sizes 32, 64, 128, 256, got {group_size}")
        q = awq_unpack(qweight).t().contiguous().to(torch.int32)  # [N, K]
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, _INNER_K_TILES)
        s = scales.to(torch.float32)
        z = awq_unpack(qzeros).to(torch.float32)
        self.scales_and_zeros = torch.stack([s, (8.0 - z) * s], dim=-1).to(dtype).contiguous()
        if dense_above > 0:
            self._dense = self.dense_weight().to(dtype).contiguous()

    @classmethod
    def from_awq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int, *,
                 dtype: torch.dtype = torch.bfloat16, dense_above: int = 0) -> Int4Linear:
        """From an AutoAWQ GEMM checkpoint's tensors (the constructor, named for readers)."""
        return cls(qweight, qzeros, scales, group_size, dtype=dtype, dense_above=dense_above)

    @classmethod
    def from_float(cls, weight: torch.Tensor, group_size: int = 64, *, dtype: torch.dtype = torch.bfloat16,
                   dense_above: int = 0) -> Int4Linear:
        """Round-to-nearest asymmetric 4-bit quantization of an [out, in] weight (AWQ's grid, no scale search).

        SmolLM2's 576-wide inputs rule out group 128 (576 = 4.5 x 128); 64 divides every layer.
        """
        qweight, qzeros, scales = awq_quantize(weight.cpu(), group_size)
        device = weight.device
        return cls(qweight.to(device), qzeros.to(device), scales.to(device), group_size, dtype=dtype,
                   dense_above=dense_above)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.dim() == 2 and x.dtype == self.dtype:
            # The engine's case (2-D rows in the layer's dtype): skip the reshapes and casts, which
            # are ~10% of a 135M model's batch-1 decode step over 90 calls.
            if self._dense is not None and x.shape[0] > self.dense_above:
                return torch.nn.functional.linear(x, self._dense)
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), self.packed, self.group_size,
                                                               self.scales_and_zeros)
        rows = as_rows(x, self.in_features).to(self.dtype)
        if self.awq is not None:
            y = dispatch.awq_gemm(rows.contiguous(), *self.awq, self.group_size)
        elif self._dense is not None and rows.shape[0] > self.dense_above:
            y = torch.nn.functional.linear(rows, self._dense)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                rows.contiguous(), self.packed, self.group_size, self.scales_and_zeros)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    forward = __call__

    @property
    def weight_bytes(self) -> int:
        if self.awq is not None:
            return tensor_bytes(*self.awq)
        return tensor_bytes(self.packed, self.scales_and_zeros, self._dense)

    def dense_weight(self) -> torch.Tensor:
        """The [out, in] weight the matmul uses (as float32, rounded to the layer's dtype on the CPU).

        On the CPU it is read back through the matmul itself, by multiplying an identity: the
        packed layout is the op's private business.
        """
        if self.awq is not None:
            return awq_dequantize(*self.awq, self.group_size).t()
        eye = torch.eye(self.in_features, dtype=self.dtype)
        cols = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, self.group_size, self.scales_and_zeros)
        return cols.t().float().contiguous()
