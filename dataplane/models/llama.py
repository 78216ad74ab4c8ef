"""A Llama-family decoder (RoPE, GQA, RMSNorm, SwiGLU) over a flattened ragged batch.

Plain tensors and callables rather than nn.Modules: a 135M-parameter model spends a large
share of each step in Python, and a lean forward with fused QKV and gate-up projections
keeps that share small.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from dataplane.models.attention import (
    AttentionMetadata,
    paged_attention,
    paged_attention_cpu,
    paged_attention_kernels,
    write_kv,
)
from dataplane.models.compiled_decode import CompiledDecode
from dataplane.models.config import LlamaArgs
from dataplane.models.fused_decode import FusedGgufDecode
from dataplane.models.layers import Linear, NeoxRotary, Rotary, rms_norm, silu_and_mul
from kernels import cpu_decode, dispatch, kv_fp8

if TYPE_CHECKING:
    from dataplane.lora.context import LoRAStepContext
    from dataplane.models.compiled_decode import CompiledDecode
    from dataplane.models.fused_decode import FusedGgufDecode


def _inference(fn):  # noqa: ANN001, ANN202
    """torch.inference_mode() around fn, unless the caller already runs in it: the runner enters it once
    per step, and a nested decorator's enter and exit cost ~10 us a call on a CPU (3 calls a step)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # noqa: ANN202
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper


@dataclass(slots=True)
class DecoderLayer:
    input_norm: torch.Tensor  # [hidden]
    qkv_proj: Linear  # fused q, k, v: [(H + 2 Hkv) * D, hidden]
    o_proj: Linear  # [hidden, H * D]
    post_norm: torch.Tensor  # [hidden]
    gate_up_proj: Linear  # fused gate and up: [2 * intermediate, hidden]
    down_proj: Linear  # [hidden, intermediate]


class LlamaModel:
    def __init__(self, args: LlamaArgs, embed: torch.Tensor, layers: list[DecoderLayer], norm: torch.Tensor,
                 lm_head: Linear, *, use_kernels: bool = False) -> None:
        self.args = args
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.dtype = embed.dtype
        self.device = embed.device
        # The torch path (CPU) or the Triton kernels (CUDA, or TESSERA_KERNELS=triton), fixed at load
        # because the q/k row order depends on it (see loader.build_llama).
        self.use_kernels = use_kernels
        rotary = NeoxRotary if use_kernels else Rotary
        self.rotary = rotary(args.head_dim, args.max_position, args.rope_theta, args.rope_scaling_factor,
                             self.device)
        self._act = dispatch.silu_and_mul if use_kernels else silu_and_mul
        self.fused: FusedGgufDecode | None = None  # decode-only steps in one C++ call (GGUF blocks only)
        self.use_cpu_ops(not use_kernels and self.device.type == "cpu" and cpu_decode.available())
        self.scale = args.head_dim ** -0.5
        self.compiled: CompiledDecode | None = None  # decode-only steps through torch.compile (opt-in)

    def use_cpu_ops(self, enabled: bool) -> None:
        """On the CPU torch path, the C++ decode ops (kernels/cpu_decode.py) where `enabled`: decode
        attention (float32, bf16), rotary + KV write (float32, bf16) and RMSNorm (float32), each one call for a dozen
        small torch ops, and for a model kept in GGUF blocks the whole decode-only step as one call
        (models/fused_decode.py); else the torch ops. Set at load from whether the extension builds here."""
        self.fused = None
        if self.use_kernels:
            self._norm, self._attention, self._rope_kv = _kernel_rms_norm, paged_attention_kernels, False
            self.cpu_ops = False
            return
        self._norm = _cpu_rms_norm if enabled and self.dtype == torch.float32 else rms_norm
        self._attention = paged_attention_cpu if enabled else paged_attention
        self._rope_kv = enabled and self.dtype in (torch.float32, torch.bfloat16)
        self.cpu_ops = enabled
        if enabled:
            self.fused = FusedGgufDecode.build(self)

    def enable_compiled_decode(self, *, cpp_wrapper: bool = False) -> bool:
        """Run decode-only steps through torch.compile (models/compiled_decode.py); compiles lazily, on
        the first such step. Only the CPU torch path: where the Triton kernels run it stays eager."""
        if self.use_kernels or self.device.type != "cpu":
            return False
        self.compiled = CompiledDecode(self, cpp_wrapper=cpp_wrapper)
        return True

    @property
    def weight_bytes(self) -> int:
        total = self.embed.numel() * self.embed.element_size() + self.norm.numel() * self.norm.element_size()
        for layer in self.layers:
            for proj in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
                total += proj.weight_bytes
            total += (layer.input_norm.numel() + layer.post_norm.numel()) * layer.input_norm.element_size()
        # Untied, a quantized copy, or a prepacked copy (float32 on the CPU) of the embedding: its own bytes.
        if not getattr(self.lm_head, "holds", lambda _t: False)(self.embed):
            total += self.lm_head.weight_bytes
        return total

    @_inference
    def forward(
        self,
        input_ids: torch.Tensor,  # [T] long
        positions: torch.Tensor,  # [T] long
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (key_cache, value_cache)
        logits_indices: torch.Tensor,  # [R] rows whose next-token logits are wanted
        lora: LoRAStepContext | None = None,  # this step's adapters; None when no token uses one
    ) -> torch.Tensor:
        return self.logits(self.hidden_states(input_ids, positions, meta, kv_caches, lora), logits_indices)

    @_inference
    def logits(self, h: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """Next-token logits (float32) of the rows `indices` of hidden_states' output."""
        return self.lm_head(self.final_norm(h[indices])).float()

    @_inference
    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """The last RMSNorm: what the lm head reads, and what embeddings pool (dataplane/runner/pooling.py)."""
        return self._norm(h, self.norm, self.args.rms_norm_eps)

    @_inference
    def hidden_states(
        self,
        input_ids: torch.Tensor,  # [T] long
        positions: torch.Tensor,  # [T] long
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (key_cache, value_cache)
        lora: LoRAStepContext | None = None,
    ) -> torch.Tensor:
        """[T, hidden]: every row's residual stream after the last layer, before the final norm."""
        if self.fused is not None and self.fused.applies(input_ids.shape[0], meta, lora):
            return self.fused(input_ids, positions, meta, kv_caches)
        if self.compiled is not None and self.compiled.applies(meta, lora):
            h = self.compiled(input_ids, positions, meta, kv_caches)
            if h is not None:  # None: the compiled path failed and is off; eager below
                return h
        a = self.args
        eps = a.rms_norm_eps
        q_size, kv_size, heads, kv_heads, d = a.q_size, a.kv_size, a.num_heads, a.num_kv_heads, a.head_dim
        n = input_ids.shape[0]
        norm, act, attention = self._norm, self._act, self._attention
        h = F.embedding(input_ids, self.embed)
        # the C++ rotary + KV write: a cache in the model's dtype, or FP8 (quantized there as write_kv does)
        fused = self._rope_kv and bool(kv_caches) and (kv_caches[0][0].dtype == h.dtype
                                                       or kv_fp8.is_fp8(kv_caches[0][0]))
        rope = None if fused else self.rotary.prepare(positions)
        add_norm = self._add_norm
        pending = None  # the last layer's MLP output: added to h by the next layer's input norm
        for i, (layer, (key_cache, value_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if pending is None:
                x = norm(h, layer.input_norm, eps)
            else:
                h, x = add_norm(h, pending, layer.input_norm, eps)
            qkv = layer.qkv_proj(x)
            if lora is not None:
                lora.apply(i, "qkv", x, qkv)
            v = qkv[:, q_size + kv_size :].view(n, kv_heads, d)
            if fused:
                q, k = cpu_decode.rope_write_kv(qkv.contiguous(), self.rotary.cos_sin, positions, key_cache,
                                                value_cache, meta.slot_mapping, heads, kv_heads)
            elif self.use_kernels:  # one launch; the attention kernels read k and v back from the cache
                q, k = self.rotary.rotate_write_kv(qkv, rope, key_cache, value_cache, meta.slot_mapping, heads,
                                                   kv_heads), None
            else:
                q, k = self.rotary.rotate(qkv, rope, heads, kv_heads)
                write_kv(key_cache, value_cache, k, v, meta.slot_mapping)
            attn = attention(q, k, v, key_cache, value_cache, meta, self.scale)
            # LoRA deltas are added in place to each fused projection's output (see dataplane/lora).
            o = layer.o_proj(attn)
            if lora is not None:
                lora.apply(i, "o", attn, o)
            h, x = add_norm(h, o, layer.post_norm, eps)
            gate_up = layer.gate_up_proj(x)
            if lora is not None:
                lora.apply(i, "gate_up", x, gate_up)
            hidden = act(gate_up)
            pending = layer.down_proj(hidden)
            if lora is not None:
                lora.apply(i, "down", hidden, pending)
        return h if pending is None else h + pending

    def _add_norm(self, h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + delta, its RMSNorm): on the kernel path one launch (the RMSNorm kernel's fused residual add,
        which rounds the sum to the model's dtype before normalizing, as the add alone does), else two ops."""
        if self.use_kernels:
            x, h = dispatch.rms_norm(delta, weight, eps, h)
            return h, x
        h = h + delta
        return h, self._norm(h, weight, eps)


def _cpu_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dim() == 2 and x.dtype == torch.float32 and weight.dtype == torch.float32:
        return cpu_decode.rms_norm(x, weight, eps)
    return rms_norm(x, weight, eps)


def _kernel_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return dispatch.rms_norm(x, weight, eps)[0]
