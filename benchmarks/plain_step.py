"""The reference column of the GPU check: a Llama decode step in plain torch, eager and as one CUDA graph.

What a decode step costs once the host is out of the way, with no kernel beyond torch's own: at the
engine's shapes (read from the model it runs), F.rms_norm, one fused QKV product, rotary, the new K/V
written into a static cache, SDPA over the cache (grouped heads), one fused gate-up product, SiLU, the
lm head, argmax. No paging, no sampling beyond argmax, no per-request state: a floor for the engine's
graph step, not the hardware's limit (weights and KV bytes over the memory bandwidth are that: the
roofline in benchmarks/roofline.py draws it).

Unlike a cost model, this is a correct step: the rotary turn is one small product with the position's
2x2-block rotation matrix (one kernel for q and k together, where rotate_half costs five), and the
query attends to cache positions 0..pos only, with no mask (the static cache's first pos + 1 entries are
a sequence; `tests/benchmarks/test_plain_step.py` decodes token by token with it and gets the engine's
tokens and logprobs). The first measurement of this floor (issue 28, H200: 1.18 ms at batch 1) skipped
rotary and attended the whole cache; this one does the rotary too, a little more work.

Timed at one position (`ctx - 1`: a cache holding ctx tokens, the engine sweep's mean context), so one
graph serves every replay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dataplane.models.config import LlamaArgs


@dataclass(slots=True)
class PlainLlama:
    args: LlamaArgs
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[dict[str, torch.Tensor]]  # qkv [(H + 2 Hkv) D, hidden], o, gate_up [2 I, hidden], down, norm1, norm2
    norm: torch.Tensor  # [hidden]
    head: torch.Tensor  # [vocab, hidden]: the embedding itself when tied

    @classmethod
    def from_hf(cls, args: LlamaArgs, t: dict[str, torch.Tensor], dtype: torch.dtype,
                device: str | torch.device) -> PlainLlama:
        """From Hugging Face-named tensors (q/k rows in rotate_half order, as checkpoints hold them)."""
        def w(name: str) -> torch.Tensor:
            return t[name].to(device=device, dtype=dtype)

        layers = []
        for i in range(args.num_layers):
            p = f"model.layers.{i}."
            layers.append({
                "qkv": torch.cat([w(p + f"self_attn.{n}_proj.weight") for n in "qkv"]),
                "o": w(p + "self_attn.o_proj.weight"),
                "gate_up": torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]),
                "down": w(p + "mlp.down_proj.weight"),
                "norm1": w(p + "input_layernorm.weight"),
                "norm2": w(p + "post_attention_layernorm.weight"),
            })
        embed = w("model.embed_tokens.weight")
        head = embed if args.tie_word_embeddings else w("lm_head.weight")
        return cls(args, embed, layers, w("model.norm.weight"), head)

    @classmethod
    def random(cls, args: LlamaArgs, dtype: torch.dtype, device: str | torch.device, seed: int = 0) -> PlainLlama:
        """Random weights at `args`' shapes, made on `device` (a speed reference: values do not matter)."""
        gen = torch.Generator(device=device).manual_seed(seed)
        h, i, q, kv = args.hidden_size, args.intermediate_size, args.q_size, args.kv_size

        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, device=device) * 0.02).to(dtype)

        layers = [{"qkv": w(q + 2 * kv, h), "o": w(h, q), "gate_up": w(2 * i, h), "down": w(h, i),
                   "norm1": torch.ones(h, device=device, dtype=dtype),
                   "norm2": torch.ones(h, device=device, dtype=dtype)} for _ in range(args.num_layers)]
        embed = w(args.vocab_size, h)
        head = embed if args.tie_word_embeddings else w(args.vocab_size, h)
        return cls(args, embed, layers, torch.ones(h, device=device, dtype=dtype), head)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def cache(self, batch: int, ctx: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Zeroed static K and V caches, per layer [batch, kv_heads, ctx, head_dim]."""
        a = self.args
        shape = (batch, a.num_kv_heads, ctx, a.head_dim)
        k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(a.num_layers)]
        return k, [torch.zeros_like(c) for c in k]

    def rotation(self, pos: int) -> torch.Tensor:
        """[D, D]: x @ R turns x (one head, rotate_half pairs (j, j + D/2)) to position `pos`, as
        Hugging Face's rotary does (the engine's frequencies: theta, linear scaling)."""
        a = self.args
        half = a.head_dim // 2
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.int64).double() / a.head_dim))
        angle = (pos / a.rope_scaling_factor) * inv_freq
        cos, sin = angle.cos(), angle.sin()
        r = torch.zeros(a.head_dim, a.head_dim, dtype=torch.float64)
        j = torch.arange(half)
        r[j, j] = cos
        r[j + half, j + half] = cos
        r[j + half, j] = -sin  # out[j] = x[j] cos - x[j + D/2] sin
        r[j, j + half] = sin  # out[j + D/2] = x[j + D/2] cos + x[j] sin
        return r.to(device=self.device, dtype=self.dtype)

    def step(self, tokens: torch.Tensor, pos: int, rot: torch.Tensor, k_cache: list[torch.Tensor],
             v_cache: list[torch.Tensor]) -> torch.Tensor:
        """Logits [batch, vocab] of every row's token at position `pos`, attending to positions 0..pos;
        writes the token's K/V at `pos`. `rot` is rotation(pos)."""
        a = self.args
        b, heads, kv_heads, d, hidden, eps = tokens.shape[0], a.num_heads, a.num_kv_heads, a.head_dim, a.hidden_size, \
            a.rms_norm_eps
        qk_size = (heads + kv_heads) * d
        x = F.embedding(tokens, self.embed)
        for i, w in enumerate(self.layers):
            h = F.rms_norm(x, (hidden,), w["norm1"], eps)
            qkv = F.linear(h, w["qkv"])
            qk = (qkv[:, :qk_size].reshape(b * (heads + kv_heads), d) @ rot).view(b, heads + kv_heads, d)
            k_cache[i][:, :, pos] = qk[:, heads:]
            v_cache[i][:, :, pos] = qkv[:, qk_size:].view(b, kv_heads, d)
            attn = F.scaled_dot_product_attention(qk[:, :heads].unsqueeze(2), k_cache[i][:, :, : pos + 1],
                                                  v_cache[i][:, :, : pos + 1], scale=d**-0.5, enable_gqa=True)
            x = x + F.linear(attn.reshape(b, heads * d), w["o"])
            h = F.rms_norm(x, (hidden,), w["norm2"], eps)
            gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["down"])
        return F.linear(F.rms_norm(x, (hidden,), self.norm, eps), self.head)


def measure(model: PlainLlama, batch: int, ctx: int, *, graph: bool, iters: int = 100, warmup: int = 3) -> dict:
    """Mean ms of one greedy step at `batch` rows, each a cache of ctx tokens (the step writes the last),
    eager or replayed as one CUDA graph; random cache contents and tokens."""
    if graph and model.device.type != "cuda":
        raise ValueError("plain_step: a CUDA graph needs a CUDA device; time the eager step elsewhere")
    gen = torch.Generator(device=model.device).manual_seed(batch)
    k_cache, v_cache = model.cache(batch, ctx)
    for c in (*k_cache, *v_cache):
        c.normal_(generator=gen)
    tokens = torch.randint(0, model.args.vocab_size, (batch,), generator=gen, device=model.device)
    pos, rot = ctx - 1, model.rotation(ctx - 1)

    def step() -> torch.Tensor:
        return model.step(tokens, pos, rot, k_cache, v_cache).argmax(-1)

    with torch.inference_mode():
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # lazy allocations and cuBLAS workspaces outside the capture
                for _ in range(warmup):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                out = step()
            run = cuda_graph.replay
        else:
            for _ in range(warmup):
                out = step()

            def run() -> None:
                step()
        run()
        _sync(model.device)
        start = time.perf_counter()
        for _ in range(iters):
            run()
        _sync(model.device)
        seconds = (time.perf_counter() - start) / iters
    del out
    return {"batch": batch, "ctx": ctx, "graph": graph, "ms": 1000 * seconds, "tok_s": batch / seconds}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
