"""The decode step's layer stack through torch.compile (Inductor, CPU), with eager as the fallback.

Why: at batch 1 a CPU decode step of a 135M model is ~15 small ops per layer beside its four
projections, and in eager PyTorch each of them is a dispatch, an allocation and (with two
threads) an OpenMP barrier. Inductor fuses the norms, residual adds, rotary and SwiGLU of a layer
into a few C++ loops. The projections and attention stay the eager ones, called from the graph
as opaque custom ops: oneDNN's prepacked weights (models/layers.Linear) are already the fastest
matmuls here, and attention reads the paged cache through per-step metadata that is no business
of the graph.

Only steps of decodes alone run compiled (no prefill chunk, no LoRA, the torch path); the token
count is the one dynamic size, so a batch-1 graph and one graph for larger batches cover every
such step. Any failure, at compile or at run, turns the compiled path off for good with a
warning, and the step runs eager: the answer is the same, only slower.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from dataplane.models.attention import write_kv

if TYPE_CHECKING:
    from dataplane.models.attention import AttentionMetadata

log = logging.getLogger(__name__)

# Opaque calls out of the graph: a projection or a layer's attention, found by key at run time.
_PROJECTIONS: dict[int, object] = {}
_OUT_FEATURES: dict[int, int] = {}
_STEPS: dict[int, tuple] = {}  # model key -> (attention fn, meta, kv_caches, scale) of the step in flight
_keys = itertools.count()


@torch.library.custom_op("tessera::projection", mutates_args=())
def _projection(x: torch.Tensor, key: int) -> torch.Tensor:
    return _PROJECTIONS[key](x)


@_projection.register_fake
def _(x: torch.Tensor, key: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], _OUT_FEATURES[key]))


@torch.library.custom_op("tessera::paged_attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model: int, layer: int) -> torch.Tensor:
    # Writes this step's K/V into the layer's cache, then attends: the cache is the step's state,
    # not the graph's (the graph's order of calls keeps layer i's write before its read).
    attention, meta, kv_caches, scale = _STEPS[model]
    key_cache, value_cache = kv_caches[layer]
    write_kv(key_cache, value_cache, k, v, meta.slot_mapping)
    return attention(q, k, v, key_cache, value_cache, meta, scale)


@_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model: int, layer: int) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary over adjacent pairs in real arithmetic (Rotary.apply's complex multiply, which Inductor
    does not lower): x [T, heads, D], cos/sin [T, 1, D/2] float32."""
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).to(x.dtype)


class CompiledDecode:
    """LlamaModel.hidden_states for decode-only steps, compiled on first use."""

    def __init__(self, model: torch.nn.Module, *, cpp_wrapper: bool = False) -> None:
        self.model = model
        self.key = next(_keys)
        self.cpp_wrapper = cpp_wrapper
        self.failed: str | None = None  # why the compiled path was turned off, once it was
        self.compile_seconds: dict[int, float] = {}  # first call's seconds, per batch size seen first
        self.calls = 0
        a = model.args
        self._layers = []
        for layer in model.layers:
            keys = []
            for proj in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj):
                k = next(_keys)
                _PROJECTIONS[k], _OUT_FEATURES[k] = proj, proj.out_features
                keys.append(k)
            self._layers.append((layer.input_norm, layer.post_norm, *keys))
        cis = model.rotary.cis  # [max_pos, D/2] complex64 (the torch path's interleaved rotary)
        self._cos, self._sin = cis.real.contiguous(), cis.imag.contiguous()
        self._sizes = (a.num_heads, a.num_kv_heads, a.head_dim, a.rms_norm_eps)
        options = {"cpp_wrapper": True} if cpp_wrapper else None
        self._compiled = torch.compile(self._forward, dynamic=None, fullgraph=True, options=options)

    def release(self) -> None:
        for _norm_in, _norm_post, *keys in self._layers:
            for k in keys:
                _PROJECTIONS.pop(k, None)
                _OUT_FEATURES.pop(k, None)

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        heads, kv_heads, d, eps = self._sizes
        n = input_ids.shape[0]
        cos, sin = self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)
        h = F.embedding(input_ids, self.model.embed)
        for i, (norm_in, norm_post, qkv_key, o_key, gate_up_key, down_key) in enumerate(self._layers):
            x = F.rms_norm(h, (h.shape[-1],), norm_in, eps)
            qkv = torch.ops.tessera.projection(x, qkv_key)
            qk = _rotate(qkv[:, : (heads + kv_heads) * d].view(n, heads + kv_heads, d), cos, sin)
            q, k = qk[:, :heads], qk[:, heads:]
            v = qkv[:, (heads + kv_heads) * d :].view(n, kv_heads, d)
            attn = torch.ops.tessera.paged_attention(q.contiguous(), k.contiguous(), v.contiguous(), self.key, i)
            h = h + torch.ops.tessera.projection(attn, o_key)
            x = F.rms_norm(h, (h.shape[-1],), norm_post, eps)
            gate, up = torch.ops.tessera.projection(x, gate_up_key).chunk(2, dim=-1)
            h = h + torch.ops.tessera.projection(F.silu(gate) * up, down_key)
        return h

    def applies(self, meta: AttentionMetadata, lora: object) -> bool:
        return self.failed is None and lora is None and not meta.prefills and bool(meta.decode_groups)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
        """[T, hidden], or None when the compiled path failed (the caller runs eager)."""
        m = self.model
        _STEPS[self.key] = (m._attention, meta, kv_caches, m.scale)
        n = int(input_ids.shape[0])
        first = n not in self.compile_seconds and (n == 1 or not any(s > 1 for s in self.compile_seconds))
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                out = self._compiled(input_ids, positions)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: eager gives the same answer
            self.failed = f"{type(exc).__name__}: {exc}"[:500]
            log.warning("compiled decode turned off, running eager: %s", self.failed)
            return None
        finally:
            _STEPS.pop(self.key, None)
        if first:
            self.compile_seconds[n] = time.perf_counter() - start
            log.info("compiled decode for %d-token steps in %.1f s", n, self.compile_seconds[n])
        self.calls += 1
        return out
