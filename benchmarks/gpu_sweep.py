"""The engine's decode sweep and prefill timings for the GPU check, and the plain-torch reference beside them.

Decode (issue 28's measurement): `batch` requests of `prompt_len` tokens, `output_tokens` greedy tokens
each with ignore_eos (and, at a few batches, sampled with temperature + top-p: the sampler's cost), the whole `LLM.generate` call timed (tok/s = tokens / call), and the same call
with one output token: (T(n) - T(1)) / (n - 1) is a decode step without the prefill. Each batch is
warmed first (its graph captured or its shapes met), CUDA graphs on ("graphs") and off ("eager"),
prefix caching off so a repeat computes what the first did. On a CPU the "graphs" engine runs the same
padded step eagerly (cuda_graphs="padded"): a rehearsal of the code, no measurement.

The reference is benchmarks.plain_step at the same shapes and batch, its cache holding the sweep's
mean context (prompt + half the output), as one CUDA graph (and eagerly); prefill is one prompt of
each length, one output token, the whole call.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from benchmarks.gpu_phases import Budget


def graph_mode(device: str) -> str:
    """The engine's cuda_graphs setting for "graphs on" here: captured graphs on a GPU, the padded
    graph-safe step run eagerly on a CPU."""
    return "cuda" if device.startswith("cuda") else "padded"


def synthetic_prompts(batch: int, length: int, vocab: int, salt: int = 0) -> list[list[int]]:
    """`batch` distinct token-id prompts of `length` (ids from 100 up, clear of most special tokens, in a
    real vocabulary; from 2 up in a tiny test one)."""
    low = 100 if vocab > 1000 else 2
    span = vocab - low
    return [[low + (7919 * (i + 1) + 31 * j + 104729 * salt) % span for j in range(length)] for i in range(batch)]


def build_llm(preloaded, device: str, mode: str, max_num_seqs: int, max_num_batched_tokens: int,  # noqa: ANN001
              kv_cache_memory: str, **kw):
    """An engine on a loaded model: mode "graphs" or "eager" (enforce_eager)."""
    from dataplane.engine.llm import LLM

    graphs = "off" if mode == "eager" else graph_mode(device)
    return LLM(str(preloaded.path), dtype=str(preloaded.model.dtype).removeprefix("torch."), device=device,
               preloaded=preloaded, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
               kv_cache_memory=kv_cache_memory, enable_prefix_caching=False, cuda_graphs=graphs, **kw)


# The sampled rows of the sweep: OpenAI-style temperature + top_p, no top_k (the whole-vocabulary draw:
# kernels/sample_full.py where the kernels run).
SAMPLED = {"temperature": 0.8, "top_p": 0.9}
SAMPLED_MODE = "graphs, top-p"


def timed_generate(llm, prompts: list[list[int]], max_tokens: int, adapters: list[str | None] | None = None,  # noqa: ANN001
                   sampling: dict | None = None) -> tuple[float, int]:
    """Seconds of one whole generate call (device synchronized around it) and the tokens it produced; greedy
    unless `sampling` gives SamplingParams' fields (each request seeded by its place, so runs repeat)."""
    from dataplane import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if sampling:
        params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i, **sampling)
                  for i in range(len(prompts))]
    device = llm.core.model.device
    _sync(device)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, adapters=adapters)
    _sync(device)
    seconds = time.perf_counter() - start
    failed = [o for o in outs if o.outputs[0].finish_reason not in ("length", "stop")]
    if failed:
        first = failed[0].outputs[0]
        raise RuntimeError(f"generate: {len(failed)} requests ended {first.finish_reason!r}: {first.error}")
    return seconds, sum(len(o.outputs[0].token_ids) for o in outs)


@dataclass(slots=True)
class DecodeRow:
    batch: int
    mode: str  # "graphs" or "eager"
    call_s: float  # the whole generate call, output_tokens each
    first_s: float  # the same call with one output token (prefill + the first sample)
    tokens: int
    tok_s: float  # tokens / call_s: the measure
    step_ms: float  # (call_s - first_s) / (output_tokens - 1): one decode step
    replays: int | None  # decode steps served by a graph (or the padded step) in the timed call


def decode_sweep(llm, mode: str, batches: list[int], prompt_len: int, output_tokens: int, budget: Budget,  # noqa: ANN001
                 out: list[dict], adapters_for=None, sampling: dict | None = None) -> None:  # noqa: ANN001
    """Append a DecodeRow (as a dict) to `out` per batch, as each is measured; stops when the budget runs short.
    `adapters_for(batch)`: each request's LoRA adapter (None: the base model); `sampling`: as timed_generate."""
    vocab = llm.core.model.args.vocab_size
    graphs = llm.core.runner.graphs
    last_s = 0.0
    for b in batches:
        if budget.expired(3 * last_s + 2):
            print(f"   {mode} b={b}: skipped, {budget.left():.0f} s left", flush=True)
            break
        started = time.perf_counter()
        prompts = synthetic_prompts(b, prompt_len, vocab, salt=b)
        adapters = adapters_for(b) if adapters_for is not None else None
        timed_generate(llm, prompts, 4, adapters, sampling)  # warm: this batch's graph captured, its shapes met
        first_s = min(timed_generate(llm, prompts, 1, adapters, sampling)[0] for _ in range(2))  # the best of two
        before = graphs.stats.replays if graphs is not None else None
        call_s, tokens = timed_generate(llm, prompts, output_tokens, adapters, sampling)
        replays = graphs.stats.replays - before if graphs is not None else None
        row = DecodeRow(b, mode, call_s, first_s, tokens, tokens / call_s,
                        1000 * max(call_s - first_s, 0.0) / max(output_tokens - 1, 1), replays)
        out.append(asdict(row))
        last_s = time.perf_counter() - started
        print(f"   {mode} b={b}: {row.tok_s:,.0f} tok/s, {row.step_ms:.2f} ms/step, replays {replays}", flush=True)


def reference_sweep(args, device: str, dtype: torch.dtype, batches: list[int], ctx: int, budget: Budget,  # noqa: ANN001
                    out: list[dict], graph: bool, eager_iters: int = 10, graph_iters: int = 100) -> None:
    """benchmarks.plain_step at each batch: one CUDA graph (graph=True, CUDA only) or eager."""
    from benchmarks.plain_step import PlainLlama, measure

    model = PlainLlama.random(args, dtype, device)
    for b in batches:
        if budget.expired(3):
            break
        row = measure(model, b, ctx, graph=graph, iters=graph_iters if graph else eager_iters)
        out.append(row)
        print(f"   plain torch {'graph' if graph else 'eager'} b={b}: {row['tok_s']:,.0f} tok/s, {row['ms']:.3f} ms",
              flush=True)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()  # each batch's cache freed before the next


def prefill_sweep(llm, lengths: list[int], budget: Budget, out: list[dict]) -> None:  # noqa: ANN001
    """One prompt of each length, one output token: the whole call (the best of two after a warm call)."""
    vocab = llm.core.model.args.vocab_size
    limit = llm.core.max_model_len - 1
    timed_generate(llm, synthetic_prompts(1, min(256, limit), vocab, salt=7), 1)
    for n in lengths:
        n = min(n, limit)
        if budget.expired(2):
            break
        prompt = synthetic_prompts(1, n, vocab, salt=n)
        best = min(timed_generate(llm, prompt, 1)[0] for _ in range(2))
        out.append({"tokens": n, "seconds": best, "tok_s": n / best})
        print(f"   prefill {n}: {1000 * best:.1f} ms, {n / best:,.0f} tok/s", flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
