"""FP8 (e4m3) weights with one float32 scale per output channel.

On CUDA the weight stays e4m3 and runs through kernels.dispatch.fp8_linear (the Triton
weight-only kernel, or W8A8 on FP8 tensor cores when asked for). The CPU has no FP8 matmul and
converts e4m3 element by element, so there the layer decodes once at construction by default.
Measured on this machine, one thread, 1536x576, batch 1: dense bf16 F.linear 88 us; decoding
e4m3 per call first costs 3358 us with .to(bfloat16) and 632 us through a 256-entry table
(index_select); W8A8 torch._scaled_mm on the CPU ~6000 us. "per_call" keeps the e4m3 bytes
resident (half the memory) at that price.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from dataplane.quant.base import as_rows, tensor_bytes
from kernels import dispatch
from kernels.reference import quantize_fp8_per_channel

CpuMode = Literal["dequantized", "per_call"]


def _e4m3_table(dtype: torch.dtype) -> torch.Tensor:
    """The value of each of the 256 e4m3 codes in `dtype` (the two NaN codes map to 0)."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    return codes.float().nan_to_num(0.0).to(dtype)


class Fp8Linear:
    """y = x (w_e4m3 · scale[:, None])^T."""

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        *,
        dtype: torch.dtype = torch.bfloat16,
        cpu_mode: CpuMode = "dequantized",
        quantize_activations: bool = False,
    ) -> None:
        if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
            raise ValueError(f"Fp8Linear: weight must be a 2-D float8_e4m3fn tensor, got {weight.dtype} "
                             f"{list(weight.shape)}")
        if weight_scale.shape != (weight.shape[0],):
            raise ValueError(f"Fp8Linear: weight_scale must be [{weight.shape[0]}], got {list(weight_scale.shape)}")
        if cpu_mode not in ("dequantized", "per_call"):
            raise ValueError(f"Fp8Linear: cpu_mode must be 'dequantized' or 'per_call', got {cpu_mode!r}")
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        self.cpu_mode: CpuMode = cpu_mode
        self.quantize_activations = quantize_activations
        self.weight: torch.Tensor | None = None  # e4m3, kept on CUDA and in per_call mode
        self.weight_scale = weight_scale.to(torch.float32).contiguous()
        self._dense: torch.Tensor | None = None  # decoded once, CPU dequantized mode
        self._table: torch.Tensor | None = None
        if weight.device.type == "cpu" and cpu_mode == "dequantized":
            self._dense = (weight.float() * self.weight_scale[:, None]).to(dtype)
        else:
            self.weight = weight.contiguous()
            if weight.device.type == "cpu":
                self._table = _e4m3_table(dtype)

    @classmethod
    def from_float(cls, weight: torch.Tensor, **kwargs: object) -> Fp8Linear:
        """Per-channel e4m3 quantization of an [out, in] float weight (scale = row amax / 448)."""
        w_fp8, scale = quantize_fp8_per_channel(weight)
        return cls(w_fp8, scale, **kwargs)  # type: ignore[arg-type]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = as_rows(x, self.in_features)
        if self._dense is not None:
            y = F.linear(rows.to(self.dtype), self._dense)
        elif self._table is not None:
            assert self.weight is not None
            codes = self.weight.view(torch.uint8).reshape(-1).to(torch.int32)
            decoded = self._table.index_select(0, codes).view(self.out_features, self.in_features)
            y = F.linear(rows.to(self.dtype), decoded) * self.weight_scale.to(self.dtype)
        else:
            assert self.weight is not None
            y = dispatch.fp8_linear(rows.to(self.dtype).contiguous(), self.weight, self.weight_scale,
                                    quantize_activations=self.quantize_activations)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    forward = __call__

    @property
    def weight_bytes(self) -> int:
        return tensor_bytes(self.weight, self.weight_scale, self._dense)

    def dense_weight(self) -> torch.Tensor:
        if self._dense is not None:
            return self._dense.float()
        assert self.weight is not None
        return self.weight.float() * self.weight_scale[:, None]
