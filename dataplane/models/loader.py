"""Load a Llama-family model from a GGUF file (dequantized with `gguf`) or a Hugging Face directory."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from dataplane.config import ModelConfig
from dataplane.models.config import LlamaArgs
from dataplane.models.disk_cache import cache_dir, file_key, temp_sibling
from dataplane.models.llama import DecoderLayer, LlamaModel
from dataplane.models.registry import resolve_model_path
from dataplane.models.tokenizer import Tokenizer
from dataplane.quant.checkpoint import Projections, QuantSpec, read_quantization_config, resolve_quantization
from kernels import dispatch

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadedModel:
    model: LlamaModel
    tokenizer: Tokenizer
    args: LlamaArgs
    path: Path


def load_model(name: str, dtype: torch.dtype, device: str | torch.device = "cpu",
               progress: bool = True, quantization: str | None = None, quantize_lm_head: bool = False,
               int4_dense_above: int = 0, weight_dtype: torch.dtype | None = None) -> LoadedModel:
    """`quantization`: None (as the checkpoint is), awq, fp8, int4, int8; see dataplane/quant/checkpoint.py.
    `weight_dtype`: dense projections' storage where it differs from `dtype` (config.resolve_weight_dtype)."""
    path = resolve_model_path(name)
    spec = resolve_quantization(quantization, read_quantization_config(path), quantize_lm_head=quantize_lm_head,
                                int4_dense_above=int4_dense_above)
    args, tensors = read_weights(path, progress)
    blocks = None
    if spec is not None and spec.method == "gguf":
        if not path.is_file():
            raise ValueError(f"quantization: 'gguf' keeps a GGUF file's own blocks; {name!r} is a directory")
        if torch.device(device).type != "cpu":
            raise ValueError("quantization: 'gguf' runs on the CPU only (its kernels are CPU kernels)")
        blocks = read_gguf_blocks(path)
    if path.is_file():
        tokenizer = Tokenizer.from_gguf(path, args.eos_token_ids)
    else:
        tokenizer = Tokenizer.from_directory(path, args.eos_token_ids)
    model = build_llama(args, tensors, dtype, torch.device(device), quant=spec, weight_dtype=weight_dtype,
                        blocks=blocks)
    log.info("loaded %s: %d layers, %.1f MiB of weights in %s%s%s", path.name, args.num_layers,
             model.weight_bytes / 2**20, dtype, f" ({spec.method})" if spec else "",
             f", projections stored in {weight_dtype}" if weight_dtype else "")
    return LoadedModel(model, tokenizer, args, path)


def load_configured(mc: ModelConfig, progress: bool = True) -> LoadedModel:
    """The model a ModelConfig names, loaded as the engine runs it (dtype, weight storage, quantization)."""
    return load_model(mc.model, mc.torch_dtype, mc.device, progress, quantization=mc.quantization,
                      quantize_lm_head=mc.quantize_lm_head, int4_dense_above=mc.int4_dense_above,
                      weight_dtype=mc.torch_weight_dtype)


def read_weights(path: Path, progress: bool = True) -> tuple[LlamaArgs, dict[str, torch.Tensor]]:
    """Arguments and Hugging Face-named tensors of a GGUF file (dequantized) or a model directory."""
    return _read_gguf_cached(path, progress) if path.is_file() else _read_hf_dir(path, progress)


def build_llama(args: LlamaArgs, t: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device,
                quant: QuantSpec | None = None, weight_dtype: torch.dtype | None = None,
                blocks: dict[str, tuple[str, torch.Tensor]] | None = None) -> LlamaModel:
    """Assemble the model from tensors named in Hugging Face's convention.

    On the torch path q/k rows are interleaved for the complex-multiply rotary; where the Triton
    kernels run (CUDA, or TESSERA_KERNELS=triton) they keep HF's rotate_half order for the kernel.
    """
    use_kernels = dispatch.use_triton(device)
    src = Projections(t, dtype, device, quant, weight_dtype, blocks)
    w = src.dense

    def rot(heads: int) -> int | None:
        return None if use_kernels else heads

    layers = []
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        layers.append(DecoderLayer(
            input_norm=w(p + "input_layernorm.weight"),
            qkv_proj=src.projection([(p + "self_attn.q_proj", rot(args.num_heads)),
                                     (p + "self_attn.k_proj", rot(args.num_kv_heads)), (p + "self_attn.v_proj", None)]),
            o_proj=src.projection([(p + "self_attn.o_proj", None)]),
            post_norm=w(p + "post_attention_layernorm.weight"),
            gate_up_proj=src.projection([(p + "mlp.gate_proj", None), (p + "mlp.up_proj", None)]),
            down_proj=src.projection([(p + "mlp.down_proj", None)]),
        ))
    embed = w("model.embed_tokens.weight")
    if args.tie_word_embeddings:
        lm_head = src.head(embed, "model.embed_tokens.weight")
    else:
        lm_head = src.head(w("lm_head.weight"))
    return LlamaModel(args, embed, layers, w("model.norm.weight"), lm_head, use_kernels=use_kernels)


# GGUF tensor names -> Hugging Face names (per layer, after the "blk.N." prefix).
_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _unpermute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert-time permutation of q/k rows (interleaved rope -> rotate_half)."""
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _read_gguf_cached(path: Path, progress: bool) -> tuple[LlamaArgs, dict[str, torch.Tensor]]:
    """The GGUF's dequantized tensors and arguments, from the local cache when present."""
    cached = cache_dir("weights") / f"{file_key(path)}.safetensors"
    if cached.exists():
        try:
            with safe_open(str(cached), framework="pt") as f:
                fields = json.loads(f.metadata()["llama_args"])
                fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
                return LlamaArgs(**fields), {name: f.get_tensor(name) for name in f.keys()}
        except Exception:  # noqa: BLE001 - a damaged cache entry is rebuilt from the GGUF
            log.warning("ignoring unreadable weight cache %s", cached)
    args, tensors = _read_gguf(path, progress)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_sibling(cached)
        save_file(tensors, str(tmp), metadata={"llama_args": json.dumps(dataclasses.asdict(args))})
        os.replace(tmp, cached)
    except OSError as exc:
        log.warning("could not cache dequantized weights: %s", exc)
    return args, tensors


def _read_gguf(path: Path, progress: bool) -> tuple[LlamaArgs, dict[str, torch.Tensor]]:
    reader = gguf.GGUFReader(str(path))
    scalars = {}
    for key, field in reader.fields.items():
        # The tokenizer's arrays are large and read by the tokenizer loader; skip them here.
        if key.startswith("tokenizer.ggml.") and key.split(".")[-1] in ("tokens", "merges", "token_type", "scores"):
            continue
        try:
            scalars[key] = field.contents()
        except Exception:  # noqa: BLE001 - an exotic field we do not need
            continue
    names = {t.name for t in reader.tensors}
    vocab = next(t.shape[1] for t in reader.tensors if t.name == "token_embd.weight")
    args = LlamaArgs.from_gguf_fields(scalars, has_output_weight="output.weight" in names, vocab_size=int(vocab))
    tensors: dict[str, torch.Tensor] = {}
    for t in tqdm(reader.tensors, desc=f"loading {path.name}", disable=not progress, unit="tensor"):
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        array = np.asarray(array, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
        if t.name.startswith("blk."):
            _, idx, rest = t.name.split(".", 2)
            if rest not in _GGUF_LAYER_NAMES:
                continue
            if rest == "attn_q.weight":
                array = _unpermute(array, args.num_heads)
            elif rest == "attn_k.weight":
                array = _unpermute(array, args.num_kv_heads)
            tensors[f"model.layers.{idx}.{_GGUF_LAYER_NAMES[rest]}"] = torch.from_numpy(np.array(array, copy=True))
        elif t.name in _GGUF_GLOBAL_NAMES:
            tensors[_GGUF_GLOBAL_NAMES[t.name]] = torch.from_numpy(np.array(array, copy=True))
    return args, tensors


# Block formats kept as they are under quantization="gguf" (dataplane/quant/gguf.py).
GGUF_BLOCK_FORMATS = ("Q4_1", "Q8_0")


def read_gguf_blocks(path: Path) -> dict[str, tuple[str, torch.Tensor]]:
    """HF name -> (format, uint8 [rows, row bytes]) for every tensor of the file in a kept block format,
    q/k rows in Hugging Face's order like the dequantized tensors; cached beside them."""
    cached = cache_dir("weights") / f"{file_key(path)}.blocks.safetensors"
    if cached.exists():
        try:
            with safe_open(str(cached), framework="pt") as f:
                formats = json.loads(f.metadata()["formats"])
                return {name: (formats[name], f.get_tensor(name)) for name in f.keys()}
        except Exception:  # noqa: BLE001 - a damaged cache entry is rebuilt from the GGUF
            log.warning("ignoring unreadable block cache %s", cached)
    blocks = _read_gguf_blocks(path)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_sibling(cached)
        save_file({k: v for k, (_, v) in blocks.items()}, str(tmp),
                  metadata={"formats": json.dumps({k: fmt for k, (fmt, _) in blocks.items()})})
        os.replace(tmp, cached)
    except OSError as exc:
        log.warning("could not cache GGUF blocks: %s", exc)
    return blocks


def _read_gguf_blocks(path: Path) -> dict[str, tuple[str, torch.Tensor]]:
    reader = gguf.GGUFReader(str(path))
    heads = {"num_heads": None, "num_kv_heads": None}
    for key, field in reader.fields.items():
        if key.endswith(".attention.head_count"):
            heads["num_heads"] = int(field.contents())
        elif key.endswith(".attention.head_count_kv"):
            heads["num_kv_heads"] = int(field.contents())
    out: dict[str, tuple[str, torch.Tensor]] = {}
    for t in reader.tensors:
        fmt = t.tensor_type.name
        if fmt not in GGUF_BLOCK_FORMATS:
            continue
        array = np.asarray(t.data, dtype=np.uint8).reshape(int(t.shape[1]), -1)  # [rows, row bytes]
        if t.name.startswith("blk."):
            _, idx, rest = t.name.split(".", 2)
            if rest not in _GGUF_LAYER_NAMES:
                continue
            if rest in ("attn_q.weight", "attn_k.weight"):  # whole rows move, as for the dense tensors
                n = heads["num_heads"] if rest == "attn_q.weight" else heads["num_kv_heads"] or heads["num_heads"]
                array = _unpermute(array, int(n))
            out[f"model.layers.{idx}.{_GGUF_LAYER_NAMES[rest]}"] = (fmt, torch.from_numpy(np.array(array, copy=True)))
        elif t.name in _GGUF_GLOBAL_NAMES:
            out[_GGUF_GLOBAL_NAMES[t.name]] = (fmt, torch.from_numpy(np.array(array, copy=True)))
    return out


def _read_hf_dir(path: Path, progress: bool) -> tuple[LlamaArgs, dict[str, torch.Tensor]]:
    args = LlamaArgs.from_hf_config(json.loads((path / "config.json").read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: no *.safetensors files in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in tqdm(files, desc=f"loading {path.name}", disable=not progress, unit="file"):
        tensors.update(load_file(str(f)))
    return args, tensors
