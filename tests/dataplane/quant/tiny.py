"""A tiny random Llama (HF tensor names), a word-level tokenizer for it, and checkpoint writers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dataplane.models.config import LlamaArgs
from dataplane.models.loader import LoadedModel, build_llama
from dataplane.models.tokenizer import Tokenizer
from dataplane.quant.checkpoint import QuantSpec
from dataplane.quantize.export import awq_config, hf_config, write_checkpoint
from kernels.awq_layout import awq_dequantize, awq_quantize

VOCAB = 96
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def tiny_args(tied: bool = False) -> LlamaArgs:
    return LlamaArgs(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position=256,
                     tie_word_embeddings=tied, eos_token_ids=(1,))


def tiny_tensors(args: LlamaArgs, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, i, d = args.hidden_size, args.intermediate_size, args.head_dim
    shapes = {"self_attn.q_proj": (args.num_heads * d, h), "self_attn.k_proj": (args.num_kv_heads * d, h),
              "self_attn.v_proj": (args.num_kv_heads * d, h), "self_attn.o_proj": (h, args.num_heads * d),
              "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    t = {"model.embed_tokens.weight": torch.randn(VOCAB, h, generator=g),
         "model.norm.weight": 1 + 0.1 * torch.randn(h, generator=g)}
    if not args.tie_word_embeddings:
        t["lm_head.weight"] = torch.randn(VOCAB, h, generator=g) / h**0.5
    for layer in range(args.num_layers):
        p = f"model.layers.{layer}."
        for name, shape in shapes.items():
            t[p + name + ".weight"] = torch.randn(*shape, generator=g) / shape[1] ** 0.5
        t[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    return t


def tiny_tokenizer() -> Tokenizer:
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    rust = RustTokenizer(WordLevel(vocab, unk_token="w0"))
    rust.pre_tokenizer = WhitespaceSplit()
    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="w0", eos_token="w1"), (1,))


def loaded(args: LlamaArgs, tensors: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
           quant: QuantSpec | None = None, path: Path = Path("tiny")) -> LoadedModel:
    return LoadedModel(build_llama(args, tensors, dtype, torch.device("cpu"), quant=quant), tiny_tokenizer(),
                       args, path)


def write_awq_checkpoint(out: Path, args: LlamaArgs, tensors: dict[str, torch.Tensor], group_size: int,
                         keep_dense: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """An AutoAWQ GEMM directory for the float model; returns the dense tensors it dequantizes to.

    `keep_dense`: projection names (q_proj, ...) left in fp16, listed in modules_to_not_convert."""
    out_tensors, dense = {}, {}
    for name, value in tensors.items():
        prefix = name.removesuffix(".weight")
        module = prefix.split(".", 3)[-1]
        if module in PROJ and module.split(".")[-1] not in keep_dense:
            qweight, qzeros, scales = awq_quantize(value, group_size)
            out_tensors |= {prefix + ".qweight": qweight, prefix + ".qzeros": qzeros, prefix + ".scales": scales}
            dense[name] = awq_dequantize(qweight, qzeros, scales, group_size).t().contiguous()
        else:
            out_tensors[name] = value.half()
            dense[name] = value.half().float()
    config = {**hf_config(args, Path("nowhere"), "float16"), "quantization_config": awq_config(group_size, list(keep_dense))}
    write_checkpoint(out, config, out_tensors, tiny_tokenizer())
    return dense


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
