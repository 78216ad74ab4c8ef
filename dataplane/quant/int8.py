"""8-bit weights, symmetric, one scale per output channel.

CPU: PyTorch's native _weight_int8pack_mm. Measured on this machine (one thread, bf16,
1536x576): 35 us at batch 1 against 88 us for dense bf16, 491 vs 200 us at batch 32. Elsewhere
the weight is dequantized per call (no custom kernel for int8 yet).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dataplane.quant.base import as_rows, tensor_bytes


class Int8Linear:
    """y = x (q · scale[:, None])^T with q int8 [out, in]."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16) -> None:
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError(f"Int8Linear: qweight must be 2-D int8, got {qweight.dtype} {list(qweight.shape)}")
        if scale.shape != (qweight.shape[0],):
            raise ValueError(f"Int8Linear: scale must be [{qweight.shape[0]}], got {list(scale.shape)}")
        self.out_features, self.in_features = qweight.shape
        self.dtype = dtype
        self.qweight = qweight.contiguous()
        self.scale = scale.to(dtype).contiguous()  # the CPU op wants the activation dtype

    @classmethod
    def from_float(cls, weight: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16) -> Int8Linear:
        scale = weight.float().abs().amax(dim=1).clamp(min=1e-12) / 127
        q = torch.round(weight.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(q, scale, dtype=dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == self.dtype and x.device.type == "cpu":  # the engine's case, no reshapes
            return torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.qweight, self.scale)
        rows = as_rows(x, self.in_features).to(self.dtype).contiguous()
        if rows.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scale)
        else:
            y = F.linear(rows, self.qweight.to(self.dtype)) * self.scale
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    forward = __call__

    @property
    def weight_bytes(self) -> int:
        return tensor_bytes(self.qweight, self.scale)

    def dense_weight(self) -> torch.Tensor:
        return self.qweight.float() * self.scale.float()[:, None]
