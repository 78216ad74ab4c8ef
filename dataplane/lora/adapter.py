"""Read and check a PEFT LoRA adapter (`adapter_config.json` + `adapter_model.safetensors`).

Everything that can fail happens here, on the caller's thread, before the engine sees the
adapter: missing files, unsupported features, shapes that do not fit the base model, ranks
above the configured maximum. What comes out is ready to copy into a device slot: per layer and
fused projection, each targeted sub-projection's A [r, in] and B [out, r] in the model's dtype,
with the scaling folded into B and B's q/k rows in the base weights' row order.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from dataplane.config import LORA_TARGET_MODULES
from dataplane.models.config import LlamaArgs
from dataplane.models.layers import interleave_rotary_rows

# Fused projection -> its sub-projections in the order of the fused output's rows.
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
MODULE_GROUP = {m: (g, k) for g, subs in GROUPS.items() for k, m in enumerate(subs)}

_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])"
                  r"(?:\.[\w-]+)?\.weight$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class GroupShape:
    in_features: int
    out_features: tuple[int, ...]  # per sub-projection, in fused order

    @property
    def out_total(self) -> int:
        return sum(self.out_features)

    def out_offset(self, sub: int) -> int:
        return sum(self.out_features[:sub])


def group_shapes(args: LlamaArgs) -> dict[str, GroupShape]:
    h, q, kv, i = args.hidden_size, args.q_size, args.kv_size, args.intermediate_size
    return {"qkv": GroupShape(h, (q, kv, kv)), "o": GroupShape(q, (h,)), "gate_up": GroupShape(h, (i, i)),
            "down": GroupShape(i, (h,))}


@dataclass(slots=True)
class SubWeights:
    sub: int  # index of the sub-projection in its group (q=0, k=1, v=2; gate=0, up=1)
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r], scaling folded in, q/k rows interleaved like the base weights


@dataclass(slots=True)
class LoRAAdapter:
    name: str  # the registered name requests use
    path: str
    rank: int  # the largest rank over its modules
    scaling: dict[str, float]  # per target module (the first layer's; patterns may vary it)
    target_modules: tuple[str, ...]  # PEFT names, in LORA_TARGET_MODULES order
    groups: frozenset[str]  # fused projections it touches
    layers: list[dict[str, list[SubWeights]]]  # per layer: group -> targeted sub-projections
    num_bytes: int
    uid: int = field(default_factory=lambda: next(_ids))  # unique per registration

    @property
    def key(self) -> str:
        """What requests carry: unique per registration, so a re-added name never meets stale KV blocks."""
        return f"{self.name}#{self.uid}"


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"adapter: name must be 1-128 characters of letters, digits and ._:/- "
                         f"(starting with a letter or digit), got {name!r}")
    return name


def load_adapter(name: str, path: str | Path, args: LlamaArgs, *, max_rank: int, dtype: torch.dtype,
                 interleave_qk: bool, pin_memory: bool = False) -> LoRAAdapter:
    """Parse and validate a PEFT adapter directory; raises ValueError naming what is wrong.

    interleave_qk: the base model stores q/k rows interleaved per head (the torch path's rotary,
    models/layers.interleave_rotary_rows); B's rows for q_proj and k_proj must follow.
    """
    check_name(name)
    where = f"adapter {name!r}"
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ValueError(f"{where}: {str(root)!r} is not a directory")
    cfg_path = root / "adapter_config.json"
    weights_path = root / "adapter_model.safetensors"
    if not cfg_path.is_file():
        raise ValueError(f"{where}: adapter_config.json is missing from {root}")
    if not weights_path.is_file():
        extra = " (adapter_model.bin is not read: pickles can run code; save with safe_serialization)" \
            if (root / "adapter_model.bin").exists() else ""
        raise ValueError(f"{where}: adapter_model.safetensors is missing from {root}{extra}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: adapter_config.json is not valid JSON: {exc}") from None
    _check_config(where, cfg)
    tensors = _read_tensors(where, weights_path)

    shapes = group_shapes(args)
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None or m.group(2) not in MODULE_GROUP:
            raise ValueError(f"{where}: tensor {key!r} targets an unsupported module; LoRA on "
                             f"{', '.join(LORA_TARGET_MODULES)} of the decoder layers is supported")
        layer = int(m.group(1))
        if layer >= args.num_layers:
            raise ValueError(f"{where}: tensor {key!r} names layer {layer}, but the base model has "
                             f"{args.num_layers} layers")
        found.setdefault((layer, m.group(2)), {})[m.group(3)] = t
    if not found:
        raise ValueError(f"{where}: adapter_model.safetensors holds no LoRA weights")

    use_rslora = bool(cfg.get("use_rslora", False))
    alpha = float(cfg.get("lora_alpha", cfg.get("r", 8)))
    layers: list[dict[str, list[SubWeights]]] = [{} for _ in range(args.num_layers)]
    scaling: dict[str, float] = {}
    rank, num_bytes = 0, 0
    for (layer, module), ab in sorted(found.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{where}: layer {layer} {module} has lora_{''.join(ab)} but not both lora_A and lora_B")
        group, sub = MODULE_GROUP[module]
        shape = shapes[group]
        a, b = ab["A"], ab["B"]
        r = a.shape[0] if a.dim() == 2 else -1
        want_a, want_b = (r, shape.in_features), (shape.out_features[sub], r)
        if a.dim() != 2 or b.dim() != 2 or tuple(a.shape) != want_a or tuple(b.shape) != want_b:
            raise ValueError(f"{where}: layer {layer} {module} has lora_A {list(a.shape)} and lora_B {list(b.shape)}; "
                             f"the base model needs [r, {shape.in_features}] and [{shape.out_features[sub]}, r] "
                             "(was it trained on a different base model?)")
        if r > max_rank:
            raise ValueError(f"{where}: rank {r} ({module}) exceeds max_lora_rank={max_rank}")
        name_in_model = f"model.layers.{layer}.{'mlp' if group in ('gate_up', 'down') else 'self_attn'}.{module}"
        a_m = _pattern_value(cfg.get("alpha_pattern") or {}, name_in_model, alpha)
        s = a_m / (math.sqrt(r) if use_rslora else r)
        scaling.setdefault(module, s)
        b = b.float() * s
        if module == "q_proj" and interleave_qk:
            b = interleave_rotary_rows(b, args.num_heads)
        elif module == "k_proj" and interleave_qk:
            b = interleave_rotary_rows(b, args.num_kv_heads)
        a_t, b_t = a.to(dtype).contiguous(), b.to(dtype).contiguous()
        if pin_memory:
            a_t, b_t = a_t.pin_memory(), b_t.pin_memory()
        layers[layer].setdefault(group, []).append(SubWeights(sub, a_t, b_t))
        rank = max(rank, r)
        num_bytes += (a_t.numel() + b_t.numel()) * a_t.element_size()
    targets = tuple(m for m in LORA_TARGET_MODULES if m in scaling)
    return LoRAAdapter(name=name, path=str(root), rank=rank, scaling=scaling, target_modules=targets,
                       groups=frozenset(MODULE_GROUP[m][0] for m in targets), layers=layers, num_bytes=num_bytes)


def _check_config(where: str, cfg: object) -> None:
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: adapter_config.json must hold an object")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ValueError(f"{where}: peft_type {peft_type!r} is not supported (LORA)")
    if cfg.get("use_dora"):
        raise ValueError(f"{where}: DoRA adapters (use_dora) are not supported")
    if cfg.get("fan_in_fan_out"):
        raise ValueError(f"{where}: fan_in_fan_out adapters (Conv1D bases) are not supported")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"{where}: LoRA bias ({cfg.get('bias')!r}) is not supported; train with bias='none'")
    if cfg.get("modules_to_save"):
        raise ValueError(f"{where}: modules_to_save ({cfg['modules_to_save']}) is not supported: "
                         "only LoRA deltas on the decoder's projections can share the base model")
    targets = cfg.get("target_modules")
    if isinstance(targets, list):
        bad = sorted(str(t) for t in targets if str(t).split(".")[-1] not in LORA_TARGET_MODULES)
        if bad:
            raise ValueError(f"{where}: target module(s) {', '.join(bad)} are not supported; "
                             f"supported: {', '.join(LORA_TARGET_MODULES)}")


def _read_tensors(where: str, path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(f"{where}: cannot read adapter_model.safetensors: {exc}") from None


def _pattern_value(patterns: dict[str, float], module: str, default: float) -> float:
    """PEFT's alpha_pattern: the first key that matches the module's full name or a dotted suffix of it."""
    for pattern, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?{pattern}", module):
            return float(value)
    return default
