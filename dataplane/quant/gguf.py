"""A projection kept in the GGUF file's own 4-bit (Q4_1) or 8-bit (Q8_0) blocks, run by kernels.gguf_cpu.

Why: a GGUF of a small model is already quantized (SmolLM2's alias ships Q4_1 projections and a
Q8_0 embedding, which is also its tied output head). Loading it dense re-expands those blocks to
16 or 32 bits, so a batch-1 decode step, which reads every weight once, streams 3-6x more bytes
than the file holds. Keeping the blocks as they are costs no weight error at all (the dense model
*is* these values); the only new error is llama.cpp's: activations rounded to 8 bits in blocks of
32 inside the kernel, which `python -m dataplane.quantize.gate --quantization gguf` measures.

The kernel loops over activation rows while a weight row sits in L1, so its work grows with the
batch while dense GEMMs do not: above `dense_above` rows (prefill chunks, large decode batches) a
dense copy answers instead, when one is kept (ModelConfig.int4_dense_above; 0 keeps none).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dataplane.quant.base import as_rows, tensor_bytes
from kernels import gguf_cpu, gguf_layout

FORMATS = {"Q4_1": gguf_layout.Q4_1_BLOCK_BYTES, "Q8_0": gguf_layout.Q8_0_BLOCK_BYTES}
_REPACK = {"Q4_1": gguf_layout.repack_q4_1, "Q8_0": gguf_layout.repack_q8_0}
_DEQUANTIZE = {"Q4_1": gguf_layout.dequantize_q4_1, "Q8_0": gguf_layout.dequantize_q8_0}


class GgufLinear:
    """y = x W^T with W as uint8 rows [out_features, in_features / 32 * block bytes] in
    kernels/gguf_layout.py's kernel layout (`from_gguf` takes the file's blocks)."""

    def __init__(self, blocks: torch.Tensor, fmt: str, in_features: int, *, dtype: torch.dtype = torch.float32,
                 dense_above: int = 0) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"GgufLinear: format {fmt!r} is not supported; use one of {', '.join(FORMATS)}")
        if blocks.device.type != "cpu":
            raise ValueError("GgufLinear: the GGUF kernels run on the CPU only")
        if in_features % gguf_layout.QK or blocks.dim() != 2 or blocks.dtype != torch.uint8 \
                or blocks.shape[1] != in_features // gguf_cpu.QK * FORMATS[fmt]:
            raise ValueError(f"GgufLinear: {fmt} blocks {blocks.dtype} {list(blocks.shape)} do not hold rows of "
                             f"{in_features} inputs")
        self.blocks = blocks.contiguous()
        self.fmt, self.dtype = fmt, dtype
        self.out_features, self.in_features = blocks.shape[0], in_features
        self._op = gguf_cpu.raw_op(fmt)  # shapes checked above; the C++ checks each call's x
        self.dense_above = dense_above
        self._dense: torch.Tensor | None = None
        self._dense_layer = None  # attach_dense: the engine's own dense projection, prepacked
        if dense_above > 0:
            self._dense = self.dense_weight().to(dtype).contiguous()

    @classmethod
    def from_gguf(cls, raw: torch.Tensor, fmt: str, in_features: int, *, dtype: torch.dtype = torch.float32,
                  dense_above: int = 0) -> GgufLinear:
        """From the file's blocks uint8 [out, in / 32 * block bytes] (loader.read_gguf_blocks)."""
        if fmt not in FORMATS:
            raise ValueError(f"GgufLinear: format {fmt!r} is not supported; use one of {', '.join(FORMATS)}")
        return cls(_REPACK[fmt](raw), fmt, in_features, dtype=dtype, dense_above=dense_above)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # the engine's case: rows in the model dtype
            if x.shape[0] > self.dense_above > 0:
                return self._dense_layer(x) if self._dense_layer is not None else F.linear(x, self._dense)
            return self._op(x.contiguous(), self.blocks, self.out_features, self.in_features)
        rows = as_rows(x, self.in_features)
        return self(rows).reshape(*x.shape[:-1], self.out_features)

    forward = __call__

    def attach_dense(self, layer, dense_above: int) -> None:
        """Answer inputs of more than `dense_above` rows with `layer` (a dense projection of
        dense_weight(), e.g. models.layers.Linear with its prepacked or float16 storage): at batch 32
        plain F.linear on a float32 copy ran slower than the kernel."""
        self._dense, self._dense_layer, self.dense_above = None, layer, dense_above

    @property
    def weight_bytes(self) -> int:
        extra = self._dense_layer.weight_bytes if self._dense_layer is not None else 0
        return tensor_bytes(self.blocks, self._dense) + extra

    def dense_weight(self) -> torch.Tensor:
        """The [out, in] float32 weight the blocks hold (the file's values, exactly)."""
        return _DEQUANTIZE[self.fmt](self.blocks, self.in_features)
