"""Which quantization a model loads with, and the projections built from its tensors.

``quantization`` (ModelConfig / LLM) picks the method:

- ``None``: whatever the checkpoint holds. A directory whose config.json carries a
  ``quantization_config`` (AutoAWQ GEMM, or our FP8) loads quantized; anything else loads dense.
- ``"awq"`` / ``"fp8"``: the checkpoint must hold that method, except that ``"fp8"`` on a dense
  checkpoint quantizes at load (per-channel e4m3 needs no calibration, so it equals what
  ``python -m dataplane.quantize --method fp8`` writes). ``"awq"`` on a dense checkpoint is
  refused: AWQ needs the calibrated scale search of the quantize CLI.
- ``"int4"`` / ``"int8"``: round-to-nearest at load from a dense checkpoint, for quick
  comparisons (int4: AWQ's asymmetric grid, group 64; int8: symmetric per channel).
- ``"gguf"``: a GGUF file's projections (and its output head) kept in the file's own Q4_1 / Q8_0
  blocks, run by the CPU kernels of kernels/gguf_cpu.py (dataplane/quant/gguf.py); the weights are
  exactly the file's, nothing is re-quantized. CPU only; other block types load dense.

Fused projections: q, k, v (and gate, up) are quantized per output column or per output
channel, so the fused layer is the concatenation of the parts along the output dimension, exact
for every method. The q/k rows interleaved for the CPU's rotary (``interleave_rotary_rows``) are
permuted in the quantized tensors' output dimension at load: AWQ's packed qweight/qzeros/scales
are unpacked, permuted and repacked; FP8 rows and their scales are permuted.

The embedding and the lm head stay in the model dtype unless ``quantize_lm_head`` (then the head
gets the method's layer, except that 4-bit methods give it int8 per channel: AWQ checkpoints never
quantize it, and round-to-nearest int4 there cost +8% perplexity).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from dataplane.config import QUANTIZATION_METHODS
from dataplane.models.layers import Linear, interleave_rotary_rows
from dataplane.quant.base import LinearLayer
from dataplane.quant.fp8 import Fp8Linear
from dataplane.quant.gguf import GgufLinear
from dataplane.quant.int4 import Int4Linear
from dataplane.quant.int8 import Int8Linear
from kernels import gguf_cpu
from kernels.awq_layout import awq_dequantize, awq_pack, awq_unpack

log = logging.getLogger(__name__)

METHODS = QUANTIZATION_METHODS
CHECKPOINT_METHODS = ("awq", "fp8")  # methods a checkpoint directory can hold
DEFAULT_INT4_GROUP = 64  # divides SmolLM2's 576 and 1536 (128 does not divide 576)

# One part of a (possibly fused) projection: its Hugging Face prefix ("model.layers.0.self_attn.q_proj")
# and, for q and k when the rows are interleaved for rotary, the number of heads.
Part = tuple[str, int | None]


@dataclass(frozen=True, slots=True)
class QuantSpec:
    method: str  # awq | fp8 | int4 | int8 | gguf
    from_checkpoint: bool  # True: read quantized tensors; False: quantize dense weights at load
    group_size: int | None = None  # int4 / awq
    quantize_lm_head: bool = False
    int4_dense_above: int = 0  # int4: rows above which a bf16 copy is used (0: never, no copy kept)


def read_quantization_config(path: Path) -> dict | None:
    """config.json's quantization_config of a model directory (None for files and dense models)."""
    cfg_path = path / "config.json"
    if not path.is_dir() or not cfg_path.exists():
        return None
    return json.loads(cfg_path.read_text()).get("quantization_config")


def resolve_quantization(requested: str | None, checkpoint: dict | None, *, quantize_lm_head: bool = False,
                         int4_dense_above: int = 0) -> QuantSpec | None:
    """The spec to load with, or None for a dense model; ValueError naming `quantization` otherwise."""
    if requested is not None and requested not in METHODS:
        raise ValueError(f"quantization: {requested!r} is not supported; use one of {', '.join(METHODS)} or None")
    held = _checkpoint_method(checkpoint) if checkpoint else None
    if held is not None:
        if requested not in (None, held):
            raise ValueError(f"quantization: the checkpoint holds {held!r} weights, not {requested!r}; "
                             "load a dense checkpoint to quantize it another way")
        group = int(checkpoint["group_size"]) if held == "awq" else None  # type: ignore[index]
        return QuantSpec(held, True, group, quantize_lm_head, int4_dense_above)
    if requested is None:
        return None
    if requested == "awq":
        raise ValueError("quantization: 'awq' needs a calibrated AWQ checkpoint (python -m dataplane.quantize "
                         "--method awq ...); use 'int4' for round-to-nearest 4-bit at load")
    if requested == "gguf":  # the file's own blocks: read, not quantized
        return QuantSpec("gguf", True, None, quantize_lm_head, int4_dense_above)
    group = DEFAULT_INT4_GROUP if requested == "int4" else None
    return QuantSpec(requested, False, group, quantize_lm_head, int4_dense_above)


def _checkpoint_method(cfg: dict) -> str:
    method = str(cfg.get("quant_method", "")).lower()
    if method == "awq":
        version = str(cfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"quantization: AWQ checkpoint version {version!r} is not supported (gemm only: "
                             "GEMV and Marlin pack their weights differently)")
        if int(cfg.get("bits", cfg.get("w_bit", 4))) != 4 or not cfg.get("zero_point", True):
            raise ValueError("quantization: only 4-bit AWQ with zero points is supported")
        group = int(cfg.get("group_size", cfg.get("q_group_size", 0)))
        if group < 16 or group & (group - 1):
            raise ValueError(f"quantization: AWQ group_size must be a power of two >= 16, got {group}")
        cfg.setdefault("group_size", group)
        return "awq"
    if method == "fp8":
        fmt = str(cfg.get("fmt", "e4m3")).lower()
        if fmt != "e4m3" or cfg.get("weight_block_size"):
            raise ValueError("quantization: only e4m3 FP8 with per-channel (or per-tensor) scales is supported")
        return "fp8"
    raise ValueError(f"quantization: checkpoint quant_method {method!r} is not supported ({', '.join(CHECKPOINT_METHODS)})")


class Projections:
    """Builds each projection of the decoder from HF-named tensors: dense, quantized, or quantized at load."""

    def __init__(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device,
                 spec: QuantSpec | None = None, weight_dtype: torch.dtype | None = None,
                 blocks: dict[str, tuple[str, torch.Tensor]] | None = None) -> None:
        self.t, self.dtype, self.device, self.spec = tensors, dtype, device, spec
        self.weight_dtype = weight_dtype  # dense projections' storage when not `dtype` (models.layers.Linear)
        # "gguf": HF name -> (block format, uint8 [rows, row bytes]) as the file holds them
        # (loader.read_gguf_blocks); without the compiled kernels those projections load dense.
        self.blocks = (blocks or {}) if spec is not None and spec.method == "gguf" and gguf_cpu.available() else {}

    # -- dense tensors -----------------------------------------------------------------------
    def dense(self, name: str) -> torch.Tensor:
        if name not in self.t:
            raise ValueError(f"model: weight {name!r} is missing from the checkpoint")
        return self.t[name].to(device=self.device, dtype=self.dtype).contiguous()

    def _dense_part(self, prefix: str, heads: int | None) -> torch.Tensor:
        if prefix + ".weight" not in self.t and prefix + ".qweight" in self.t:
            q = self.t[prefix + ".qweight"]
            w = awq_dequantize(q, self.t[prefix + ".qzeros"], self.t[prefix + ".scales"],
                               q.shape[0] // self.t[prefix + ".scales"].shape[0]).t()
        elif self.t.get(prefix + ".weight") is not None and self.t[prefix + ".weight"].dtype == torch.float8_e4m3fn:
            w = self.t[prefix + ".weight"].float() * _fp8_scale(self.t, prefix)[:, None]
        else:
            w = self.dense(prefix + ".weight")
        w = w.to(device=self.device, dtype=self.dtype)
        return interleave_rotary_rows(w, heads) if heads else w

    # -- projections -------------------------------------------------------------------------
    def projection(self, parts: list[Part]) -> LinearLayer | Linear:
        spec = self.spec
        if self.blocks and all(p + ".weight" in self.blocks for p, _ in parts) \
                and len({self.blocks[p + ".weight"][0] for p, _ in parts}) == 1:
            return self._gguf([(self.blocks[p + ".weight"][1], h) for p, h in parts],
                              self.blocks[parts[0][0] + ".weight"][0], self.t[parts[0][0] + ".weight"].shape[1])
        if spec is not None and spec.from_checkpoint:
            if spec.method == "awq" and all(p + ".qweight" in self.t for p, _ in parts):
                return self._awq(parts)
            if spec.method == "fp8" and all(self.t.get(p + ".weight") is not None
                                            and self.t[p + ".weight"].dtype == torch.float8_e4m3fn for p, _ in parts):
                return _plain_if_decoded(self._fp8(parts))
            # Parts the checkpoint left dense (modules_to_not_convert) stay dense.
            return self._linear(torch.cat([self._dense_part(p, h) for p, h in parts]))
        weight = torch.cat([self._dense_part(p, h) for p, h in parts])
        return self._linear(weight) if spec is None else self._quantize(weight)

    def head(self, weight: torch.Tensor, name: str = "lm_head.weight") -> LinearLayer | Linear:
        """The output projection (`name`: the tensor it is, the embedding when tied): dense unless asked
        to quantize it, or as the GGUF file holds it under "gguf"."""
        if name in self.blocks:
            fmt, blocks = self.blocks[name]
            return self._gguf([(blocks, None)], fmt, weight.shape[1])
        if self.spec is None or not self.spec.quantize_lm_head:
            return self._linear(weight)
        # 4-bit methods get an int8 head: round-to-nearest int4 on the head cost +8% perplexity on
        # SmolLM2 (benchmarks/results/quant.md), int8 per channel next to nothing, for half the bytes.
        method = "int8" if self.spec.method in ("awq", "int4", "gguf") else self.spec.method
        return self._quantize(weight, method)

    def _linear(self, weight: torch.Tensor) -> Linear:
        return Linear(weight, storage=self.weight_dtype)

    def _quantize(self, weight: torch.Tensor, method: str | None = None) -> LinearLayer:
        assert self.spec is not None
        method = method or self.spec.method
        if method == "int4":
            return Int4Linear.from_float(weight.float(), self.spec.group_size or DEFAULT_INT4_GROUP, dtype=self.dtype,
                                         dense_above=self.spec.int4_dense_above)
        if method == "int8":
            return Int8Linear.from_float(weight.float(), dtype=self.dtype)
        return _plain_if_decoded(Fp8Linear.from_float(weight.float(), dtype=self.dtype))

    def _awq(self, parts: list[Part]) -> Int4Linear:
        assert self.spec is not None and self.spec.group_size is not None
        qs, zs, ss = [], [], []
        for prefix, heads in parts:
            q, z = awq_unpack(self.t[prefix + ".qweight"]), awq_unpack(self.t[prefix + ".qzeros"])
            s = self.t[prefix + ".scales"]
            if heads:  # output columns follow the interleaved q/k rows
                q, z, s = (interleave_rotary_rows(x.t(), heads).t() for x in (q, z, s))
            qs.append(q)
            zs.append(z)
            ss.append(s)
        qweight, qzeros = awq_pack(torch.cat(qs, dim=1)), awq_pack(torch.cat(zs, dim=1))
        scales = torch.cat(ss, dim=1).contiguous()
        dev = self.device
        return Int4Linear.from_awq(qweight.to(dev), qzeros.to(dev), scales.to(dev), self.spec.group_size,
                                   dtype=self.dtype, dense_above=self.spec.int4_dense_above)

    def _gguf(self, parts: list[tuple[torch.Tensor, int | None]], fmt: str, in_features: int) -> GgufLinear:
        assert self.spec is not None
        # Block rows are whole output rows, so q/k's rotary interleave permutes them like dense rows.
        rows = [interleave_rotary_rows(b, heads) if heads else b for b, heads in parts]
        layer = GgufLinear.from_gguf(torch.cat(rows).contiguous(), fmt, in_features, dtype=self.dtype)
        if self.spec.int4_dense_above > 0:  # big batches on the engine's dense projection, as a dense model
            layer.attach_dense(self._linear(layer.dense_weight().to(self.dtype)), self.spec.int4_dense_above)
        return layer

    def _fp8(self, parts: list[Part]) -> Fp8Linear:
        weights, scales = [], []
        for prefix, heads in parts:
            w, s = self.t[prefix + ".weight"].view(torch.uint8), _fp8_scale(self.t, prefix)
            if heads:
                w, s = interleave_rotary_rows(w, heads), interleave_rotary_rows(s[:, None], heads)[:, 0]
            weights.append(w)
            scales.append(s)
        weight = torch.cat(weights).view(torch.float8_e4m3fn).to(self.device)
        return Fp8Linear(weight, torch.cat(scales).to(self.device), dtype=self.dtype)


def _plain_if_decoded(layer: Fp8Linear) -> Fp8Linear | Linear:
    """On the CPU an Fp8Linear holds its weight decoded to the model dtype: serve it as a plain Linear,
    whose call is one F.linear (the wrapper's reshapes and casts cost ~9% of a batch-1 decode step)."""
    return Linear(layer._dense) if layer._dense is not None else layer


def _fp8_scale(t: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """Per-channel float32 [N] scale; accepts [N], [N, 1] (compressed-tensors) and per-tensor scalars."""
    rows = t[prefix + ".weight"].shape[0]
    scale = t[prefix + ".weight_scale"].float().reshape(-1)
    if scale.numel() == 1:
        scale = scale.expand(rows)
    if scale.numel() != rows:
        raise ValueError(f"model: {prefix}.weight_scale has {scale.numel()} values for {rows} output channels")
    return scale.contiguous()
