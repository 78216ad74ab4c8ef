"""The projection protocol the engine calls, and the dense layer every quantized one stands in for."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F


@runtime_checkable
class LinearLayer(Protocol):
    """y = x W^T for x [..., in_features]; what dataplane/models holds for each projection."""

    in_features: int
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    @property
    def weight_bytes(self) -> int:
        """Bytes resident in memory for this layer's weights (packed data, scales and zeros)."""
        ...

    def dense_weight(self) -> torch.Tensor:
        """The [out, in] float weight this layer computes with: its dequantized twin."""
        ...


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def as_rows(x: torch.Tensor, in_features: int) -> torch.Tensor:
    if x.shape[-1] != in_features:
        raise ValueError(f"expected input features {in_features}, got shape {list(x.shape)}")
    return x.reshape(-1, in_features)


class DenseLinear:
    """Plain F.linear on a float weight [out, in]."""

    __slots__ = ("weight", "in_features", "out_features")

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dim() != 2:
            raise ValueError(f"DenseLinear: weight must be [out, in], got {list(weight.shape)}")
        self.weight = weight
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    forward = __call__

    @property
    def weight_bytes(self) -> int:
        return tensor_bytes(self.weight)

    def dense_weight(self) -> torch.Tensor:
        return self.weight
