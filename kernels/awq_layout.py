"""AutoAWQ's GEMM checkpoint layout for 4-bit weights, as plain torch.

An AWQ GEMM checkpoint stores, per linear layer with in_features K and out_features N:

- ``qweight`` int32 [K, N/8]: the quantized weight *transposed* (input dim first), eight 4-bit
  output columns per int32;
- ``qzeros`` int32 [K/G, N/8]: one 4-bit zero point per group of G input rows and output column,
  packed the same way;
- ``scales`` fp16 [K/G, N].

Inside each int32 the nibbles are interleaved: nibble i (bits 4i..4i+3) holds column
``AWQ_ORDER[i]`` of its group of eight, so column c sits at nibble ``AWQ_REVERSE_ORDER[c]``.
AutoAWQ chose this order so that its CUDA dequantizer can turn two nibbles at a time into a
half2 with one lop3; we keep it bit for bit so that existing checkpoints load unchanged.

Dequantization: ``w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]``, and ``y = x @ w``.
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
PACK_FACTOR = 8  # 4-bit values per int32


def awq_pack(values: torch.Tensor) -> torch.Tensor:
    """[R, C] integers in 0..15 → int32 [R, C/8] in AutoAWQ's nibble order."""
    if values.dim() != 2 or values.shape[1] % PACK_FACTOR:
        raise ValueError(f"awq_pack: expected [rows, cols] with cols a multiple of 8, got {list(values.shape)}")
    if values.numel() and (int(values.min()) < 0 or int(values.max()) > 15):
        raise ValueError("awq_pack: values must lie in 0..15")
    grouped = values.to(torch.int64).reshape(values.shape[0], -1, PACK_FACTOR)
    packed = torch.zeros(grouped.shape[:2], dtype=torch.int64, device=values.device)
    for nibble, column in enumerate(AWQ_ORDER):
        packed |= grouped[:, :, column] << (4 * nibble)
    # Fold to the signed int32 that AutoAWQ stores (the top nibble reaches the sign bit).
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C/8] → uint8 [R, C] with values 0..15; the inverse of `awq_pack`."""
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"awq_unpack: expected a 2-D int32 tensor, got {packed.dtype} {list(packed.shape)}")
    shifts = torch.tensor([4 * n for n in AWQ_REVERSE_ORDER], dtype=torch.int32, device=packed.device)
    nibbles = (packed[:, :, None] >> shifts) & 0xF  # arithmetic shift is fine: the mask drops sign bits
    return nibbles.reshape(packed.shape[0], -1).to(torch.uint8)


def awq_dequantize(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int = 128
) -> torch.Tensor:
    """The dense float32 [K, N] weight (input dim first) that an AWQ triple stands for."""
    q = awq_unpack(qweight).to(torch.float32)
    z = awq_unpack(qzeros).to(torch.float32).repeat_interleave(group_size, dim=0)
    s = scales.to(torch.float32).repeat_interleave(group_size, dim=0)
    return (q - z) * s


def awq_quantize(
    weight: torch.Tensor, group_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric 4-bit quantization of an nn.Linear weight [N, K].

    Same per-group min/max rule as AutoAWQ's ``pseudo_quantize_tensor`` (AWQ's scale search
    multiplies the weight by per-channel scales first and then calls exactly this), returned
    as (qweight, qzeros, scales) in the checkpoint layout.
    """
    if weight.dim() != 2:
        raise ValueError(f"awq_quantize: expected a 2-D weight [out, in], got {list(weight.shape)}")
    n, k = weight.shape
    if k % group_size or n % PACK_FACTOR:
        raise ValueError(f"awq_quantize: in_features {k} must divide by group_size {group_size} "
                         f"and out_features {n} by 8")
    w = weight.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    w_max, w_min = w.amax(dim=-1), w.amin(dim=-1)
    scales = ((w_max - w_min).clamp(min=1e-5) / 15).to(torch.float16)
    scales_f = scales.to(torch.float32)  # quantize against the fp16 scales that will be stored
    zeros = (-torch.round(w_min / scales_f)).clamp(0, 15)
    q = (torch.round(w / scales_f[..., None]) + zeros[..., None]).clamp(0, 15)
    qweight = awq_pack(q.reshape(n, k).t().contiguous())
    qzeros = awq_pack(zeros.t().contiguous())
    return qweight, qzeros, scales.t().contiguous()
