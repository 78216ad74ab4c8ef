"""Small PEFT-format adapters written by hand, and a per-token reference for their deltas (no model)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from dataplane.lora.adapter import MODULE_GROUP, group_shapes
from dataplane.models.config import LlamaArgs
from dataplane.models.layers import interleave_rotary_rows

TINY = LlamaArgs(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, max_position=128, tie_word_embeddings=True)


def module_part(module: str) -> str:
    return "mlp" if MODULE_GROUP[module][0] in ("gate_up", "down") else "self_attn"


def write_adapter(path: Path, args: LlamaArgs, rank: int, targets: tuple[str, ...], *, alpha: float | None = None,
                  rslora: bool = False, seed: int = 0, config: dict | None = None,
                  tensors: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Write adapter_config.json + adapter_model.safetensors as PEFT's save_pretrained does."""
    gen = torch.Generator().manual_seed(seed)
    shapes = group_shapes(args)
    if tensors is None:
        tensors = {}
        for layer in range(args.num_layers):
            for m in targets:
                group, sub = MODULE_GROUP[m]
                prefix = f"base_model.model.model.layers.{layer}.{module_part(m)}.{m}"
                tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, shapes[group].in_features, generator=gen) * 0.3
                tensors[f"{prefix}.lora_B.weight"] = torch.randn(shapes[group].out_features[sub], rank,
                                                                 generator=gen) * 0.3
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank,
           "target_modules": list(targets), "use_rslora": rslora, "bias": "none"}
    cfg.update(config or {})
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return tensors


def reference_delta(tensors: dict[str, torch.Tensor], args: LlamaArgs, layer: int, group: str, x: torch.Tensor,
                    scaling: float, interleave_qk: bool) -> torch.Tensor:
    """The fused projection's delta for one adapter, straight from PEFT's formula s * x A^T B^T."""
    shapes = group_shapes(args)[group]
    out = torch.zeros(x.shape[0], shapes.out_total, dtype=torch.float64)
    for module, (g, sub) in MODULE_GROUP.items():
        if g != group:
            continue
        prefix = f"base_model.model.model.layers.{layer}.{module_part(module)}.{module}"
        if f"{prefix}.lora_A.weight" not in tensors:
            continue
        a = tensors[f"{prefix}.lora_A.weight"].double()
        b = tensors[f"{prefix}.lora_B.weight"].double()
        if interleave_qk and module in ("q_proj", "k_proj"):
            b = interleave_rotary_rows(b, args.num_heads if module == "q_proj" else args.num_kv_heads)
        lo = shapes.out_offset(sub)
        out[:, lo : lo + shapes.out_features[sub]] += scaling * (x.double() @ a.t() @ b.t())
    return out


def lora_scaling(alpha: float, rank: int, rslora: bool) -> float:
    return alpha / (math.sqrt(rank) if rslora else rank)
