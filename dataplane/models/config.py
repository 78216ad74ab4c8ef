"""Architecture hyper-parameters of a Llama-family decoder, read from GGUF metadata or config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class LlamaArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int  # the model's context length
    tie_word_embeddings: bool
    rope_scaling_factor: float = 1.0  # "linear" scaling only; other schemes are refused at load
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> LlamaArgs:
        arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
        if cfg.get("model_type", "llama") not in ("llama", "mistral") and arch != "LlamaForCausalLM":
            raise ValueError(f"model: architecture {arch!r} is not a Llama-family decoder")
        scaling = cfg.get("rope_scaling") or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "linear"):
            raise ValueError(f"model: rope_scaling type {kind!r} is not supported (default, linear)")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", 10000.0),
            max_position=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            rope_scaling_factor=float(scaling.get("factor", 1.0)) if kind == "linear" else 1.0,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_gguf_fields(cls, f: dict[str, Any], *, has_output_weight: bool, vocab_size: int) -> LlamaArgs:
        arch = f.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"model: GGUF architecture {arch!r} is not supported (llama)")
        heads = f["llama.attention.head_count"]
        hidden = f["llama.embedding_length"]
        eos = f.get("tokenizer.ggml.eos_token_id")
        return cls(
            vocab_size=f.get("llama.vocab_size", vocab_size),
            hidden_size=hidden,
            intermediate_size=f["llama.feed_forward_length"],
            num_layers=f["llama.block_count"],
            num_heads=heads,
            num_kv_heads=f.get("llama.attention.head_count_kv", heads),
            head_dim=f.get("llama.rope.dimension_count", hidden // heads),
            rms_norm_eps=f.get("llama.attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=f.get("llama.rope.freq_base", 10000.0),
            max_position=f.get("llama.context_length", 2048),
            tie_word_embeddings=not has_output_weight,
            bos_token_id=f.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=(eos,) if eos is not None else (),
        )
