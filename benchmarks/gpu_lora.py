"""LoRA in the GPU check: PEFT adapters written at the model's shapes, and a batch mixing them.

The adapters are written here as PEFT's save_pretrained writes them (adapter_config.json +
adapter_model.safetensors, every decoder layer, all seven projections), with random weights: speed
does not depend on their values, and the graph-vs-eager comparison compares a model with itself.
Small values (`scale`) keep a real model's outputs readable, so that greedy near-ties stay as rare as
the base model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dataplane.config import LORA_TARGET_MODULES
from dataplane.lora.adapter import MODULE_GROUP, group_shapes
from dataplane.models.config import LlamaArgs


def write_adapter(path: Path, args: LlamaArgs, rank: int, seed: int, scale: float = 0.02,
                  dtype: torch.dtype = torch.bfloat16) -> int:
    """A rank-`rank` adapter on every projection of every layer; returns the weights' size in bytes."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    shapes = group_shapes(args)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(args.num_layers):
        for module in LORA_TARGET_MODULES:
            group, sub = MODULE_GROUP[module]
            part = "mlp" if group in ("gate_up", "down") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            a = torch.randn(rank, shapes[group].in_features, generator=gen) * scale
            b = torch.randn(shapes[group].out_features[sub], rank, generator=gen) * scale
            tensors[f"{prefix}.lora_A.weight"] = a.to(dtype)
            tensors[f"{prefix}.lora_B.weight"] = b.to(dtype)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(LORA_TARGET_MODULES),
              "use_rslora": False, "bias": "none"}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def add_adapters(llm, root: Path, args: LlamaArgs, count: int, rank: int, scale: float = 0.02) -> list[str]:  # noqa: ANN001
    """Write `count` adapters under `root` (once: an existing one is reused) and register them; their names."""
    names = []
    for i in range(count):
        name = f"lora{i}"
        path = root / f"{args.num_layers}x{args.hidden_size}-r{rank}-s{scale}-{i}"  # one per model shape
        if not (path / "adapter_model.safetensors").exists():
            write_adapter(path, args, rank, seed=1000 + i, scale=scale)
        llm.add_adapter(name, str(path))
        names.append(name)
    return names


def mixed(names: list[str], batch: int) -> list[str | None]:
    """Every adapter in turn across the batch's rows."""
    return [names[i % len(names)] for i in range(batch)]
