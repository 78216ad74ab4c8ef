"""Writing quantized checkpoints: complete Hugging Face-style model directories.

Each directory holds ``config.json`` (the model's config plus ``quantization_config``),
``model.safetensors`` and the tokenizer files (``tokenizer.json`` and friends, chat template
included), so it loads with ``LLM(model=DIR)`` and with Hugging Face-style loaders.

- AWQ: AutoAWQ's GEMM layout, ``quantization_config = {"quant_method": "awq", "bits": 4,
  "group_size": G, "zero_point": true, "version": "gemm", "modules_to_not_convert": null}``;
  per projection ``<proj>.qweight`` int32 [K, N/8], ``.qzeros`` int32 [K/G, N/8], ``.scales``
  fp16 [K/G, N]; everything else fp16 (norm weights carry the folded AWQ scales).
- FP8: ``quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
  "dynamic", "weight_scheme": "per_channel"}``; per projection ``<proj>.weight``
  float8_e4m3fn [N, K] and ``<proj>.weight_scale`` float32 [N] (weight ≈ e4m3 · scale per row,
  scale = row amax / 448); the rest bf16. Activations are not quantized unless the loader asks
  for W8A8 on a GPU with FP8 tensor cores.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from dataplane.models.config import LlamaArgs
from dataplane.models.tokenizer import Tokenizer
from kernels.reference import quantize_fp8_per_channel

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def awq_config(group_size: int, modules_to_not_convert: list[str] | None = None) -> dict:
    """AutoAWQ's quantization_config; modules_to_not_convert names projections kept in float (substrings)."""
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": modules_to_not_convert or None}


FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_scheme": "per_channel"}


def hf_config(args: LlamaArgs, source: Path, torch_dtype: str) -> dict:
    """The source directory's config.json, or one written from the arguments of a GGUF."""
    if source.is_dir() and (source / "config.json").exists():
        cfg = json.loads((source / "config.json").read_text())
        cfg.pop("quantization_config", None)
    else:
        cfg = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "vocab_size": args.vocab_size, "hidden_size": args.hidden_size,
            "intermediate_size": args.intermediate_size, "num_hidden_layers": args.num_layers,
            "num_attention_heads": args.num_heads, "num_key_value_heads": args.num_kv_heads,
            "head_dim": args.head_dim, "rms_norm_eps": args.rms_norm_eps, "rope_theta": args.rope_theta,
            "max_position_embeddings": args.max_position, "tie_word_embeddings": args.tie_word_embeddings,
            "bos_token_id": args.bos_token_id,
            "eos_token_id": list(args.eos_token_ids) if len(args.eos_token_ids) > 1 else
            (args.eos_token_ids[0] if args.eos_token_ids else None),
            "attention_bias": False, "mlp_bias": False,
        }
        if args.rope_scaling_factor != 1.0:
            cfg["rope_scaling"] = {"rope_type": "linear", "factor": args.rope_scaling_factor}
    cfg["torch_dtype"] = torch_dtype
    return cfg


def fp8_tensors(args: LlamaArgs, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-channel e4m3 projections; embedding, norms (and an untied head) in bf16."""
    out: dict[str, torch.Tensor] = {}
    for i in range(args.num_layers):
        for proj in PROJECTIONS:
            name = f"model.layers.{i}.{proj}"
            w8, scale = quantize_fp8_per_channel(tensors[name + ".weight"].float())
            out[name + ".weight"], out[name + ".weight_scale"] = w8, scale
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"model.layers.{i}.{norm}.weight"] = tensors[f"model.layers.{i}.{norm}.weight"].bfloat16()
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        if name in tensors and not (name == "lm_head.weight" and args.tie_word_embeddings):
            out[name] = tensors[name].bfloat16()
    return out


def write_checkpoint(out_dir: Path, config: dict, tensors: dict[str, torch.Tensor], tokenizer: Tokenizer) -> Path:
    """Write the directory atomically (to a sibling, then renamed over `out_dir`)."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.hf.save_pretrained(str(tmp))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir
