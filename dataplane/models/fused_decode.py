"""Decode-only steps of a model kept in GGUF blocks as one C++ call (kernels/cpu/gguf_decoder.cpp).

Why: with the file's 4-bit weights a batch-1 step streams ~96 MB, 2 ms at this machine's bandwidth,
yet one projection or op at a time took 6.4 ms (AVX-512 BF16 EPYC, 2 threads): 30 layers of a dozen
Python calls, each a dispatch, an allocation and an OpenMP region whose threads had gone to sleep.
The fused call keeps the threads in one region for the whole step, meeting at barriers.

It takes steps of decodes alone (no prefill chunk, no LoRA), up to the rows where the projections
would switch to their dense copy (`GgufLinear.dense_above`), on models whose four projections are
all GgufLinear. The final norm and the lm head stay with LlamaModel.logits. The per-op path is its
twin: the same arithmetic one op at a time, kept for every other step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

from dataplane.quant.gguf import GgufLinear
from kernels import gguf_cpu

if TYPE_CHECKING:
    from dataplane.models.attention import AttentionMetadata
    from dataplane.models.config import LlamaArgs


class DecoderModel(Protocol):
    """What the fused step reads of models.llama.LlamaModel (not imported: llama builds this module's object)."""

    args: LlamaArgs
    layers: list[Any]  # DecoderLayer: input_norm, qkv_proj, o_proj, post_norm, gate_up_proj, down_proj
    embed: torch.Tensor
    rotary: Any  # models.layers.Rotary (its cos_sin table)
    dtype: torch.dtype
    device: torch.device
    use_kernels: bool


_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class FusedGgufDecode:
    """LlamaModel.hidden_states for decode-only steps; `build` says whether the model can have one."""

    def __init__(self, model: DecoderModel) -> None:
        a = model.args
        layers = model.layers
        projections = [getattr(layer, name) for layer in layers for name in _PROJECTIONS]
        self.embed = model.embed
        self.decoder = gguf_cpu.decoder(
            [p.blocks for p in projections], [p.fmt for p in projections],
            [layer.input_norm for layer in layers], [layer.post_norm for layer in layers], model.rotary.cos_sin,
            heads=a.num_heads, kv_heads=a.num_kv_heads, head_dim=a.head_dim, eps=a.rms_norm_eps,
            scale=a.head_dim ** -0.5)
        # Above this many rows a projection answers from its dense copy: the per-op path is then faster.
        limits = [p.dense_above for p in projections if p.dense_above > 0]
        self.max_rows = min(limits) if limits else None

    @staticmethod
    def build(model: DecoderModel) -> FusedGgufDecode | None:
        """The fused step for `model`, or None where it does not apply (not all projections in GGUF
        blocks, not the CPU torch path, a dtype other than float32 / bf16, or no compiled kernels)."""
        if (model.use_kernels or model.device.type != "cpu" or model.dtype not in (torch.float32, torch.bfloat16)
                or not hasattr(model.rotary, "cos_sin") or not gguf_cpu.available()):
            return None
        if not all(isinstance(getattr(layer, name), GgufLinear) for layer in model.layers for name in _PROJECTIONS):
            return None
        return FusedGgufDecode(model)

    def applies(self, n: int, meta: AttentionMetadata, lora: object | None) -> bool:
        return (lora is None and not meta.prefills and bool(meta.decode_groups)
                and (self.max_rows is None or n <= self.max_rows))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        groups = meta.decode_groups
        if len(groups) == 1:
            tables, lens = groups[0].block_tables, groups[0].context_lens
        else:  # groups of other widths: one table padded to the widest (the pad is never read)
            width = max(g.block_tables.shape[1] for g in groups)
            tables = torch.cat([F.pad(g.block_tables, (0, width - g.block_tables.shape[1])) for g in groups])
            lens = torch.cat([g.context_lens for g in groups])
        return self.decoder.forward(F.embedding(input_ids, self.embed), positions, meta.slot_mapping, tables, lens,
                                    [k for k, _ in kv_caches], [v for _, v in kv_caches])
