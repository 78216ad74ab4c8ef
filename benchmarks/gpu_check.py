"""The check to run the day a GPU is lent: is the CUDA path right, and how fast is it?

    python -m benchmarks.gpu_check [--max-tokens 32] [--no-throughput] [--model PATH_OR_ALIAS]

On a CUDA device:
1. the real model (SmolLM2-135M) through the engine with the Triton kernels, float32, greedy,
   against the CPU path (the torch references): the same tokens, and the sampled tokens'
   logprobs and top-5 alternatives within LOGPROB_TOL. A divergence where the CPU's two best
   tokens are within TIE_TOL of each other is a near-tie, reported but not a failure;
2. every Triton kernel against its torch twin at production shapes (benchmarks/gpu_check_kernels);
3. decode throughput in bfloat16 at batch 1 and 32.
Exits 1 on any mismatch, writes benchmarks/results/gpu_check.{json,md}. `--model` takes another
model (a lent machine receives at most 64 MiB: `python -m benchmarks.gguf_truncate` makes a
smaller real-weights SmolLM2 with its first layers).

Without CUDA it says so and exits 0: there is nothing to check on a CPU-only host (the kernels'
CPU tests run them in Triton's interpreter instead, tests/kernels/).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from benchmarks.common import environment, fmt, write_results
from dataplane.scheduler.output import TokenLogprobs

MODEL = "smollm2-135m-instruct"
LOGPROB_TOL = 2e-3  # float32 on both sides: only summation order differs (~1e-5 seen on CPU thread counts)
TIE_TOL = 1e-2  # a greedy pick between two tokens this close may flip on any summation order
PROMPTS = [
    "The capital of France is",
    "Write a haiku about a river in spring.",
    "def fibonacci(n):\n    ",
    "Explain what a paged KV cache is, in two sentences.",
]


@dataclass(slots=True)
class SequenceCheck:
    prompt: int
    compared: int  # tokens compared before the end or a near-tie divergence
    max_logprob_err: float
    diverged_at: int | None  # first differing position, or None
    near_tie: bool  # the divergence is explained by a near-tie on the CPU side
    ok: bool


def compare_sequences(index: int, cpu: list[TokenLogprobs], gpu: list[TokenLogprobs],
                      logprob_tol: float = LOGPROB_TOL, tie_tol: float = TIE_TOL) -> SequenceCheck:
    """Greedy tokens must agree; logprobs of the sampled token and of shared alternatives within tol."""
    worst = 0.0
    for pos, (c, g) in enumerate(zip(cpu, gpu, strict=False)):
        if c.token_id != g.token_id:
            alt = dict(c.top).get(g.token_id)
            tie = alt is not None and c.logprob - alt <= tie_tol
            return SequenceCheck(index, pos, worst, pos, tie, tie and worst <= logprob_tol)
        worst = max(worst, abs(c.logprob - g.logprob))
        g_top = dict(g.top)
        worst = max([worst] + [abs(lp - g_top[t]) for t, lp in c.top if t in g_top])
    same_length = len(cpu) == len(gpu)
    return SequenceCheck(index, min(len(cpu), len(gpu)), worst, None if same_length else min(len(cpu), len(gpu)),
                         False, same_length and worst <= logprob_tol)


def _generate(device: str, dtype: str, prompts: list, max_tokens: int, *, logprobs: int | None = 5,
              max_num_seqs: int = 64, ignore_eos: bool = False):
    from dataplane import SamplingParams
    from dataplane.engine.llm import LLM

    llm = LLM(MODEL, dtype=dtype, device=device, max_num_seqs=max_num_seqs, kv_cache_memory="2GiB")
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=logprobs, ignore_eos=ignore_eos)
    return llm, llm.generate(prompts, params)


def engine_check(max_tokens: int) -> list[SequenceCheck]:
    _, cpu = _generate("cpu", "float32", PROMPTS, max_tokens)
    _, gpu = _generate("cuda", "float32", PROMPTS, max_tokens)
    return [compare_sequences(i, c.outputs[0].logprobs or [], g.outputs[0].logprobs or [])
            for i, (c, g) in enumerate(zip(cpu, gpu, strict=True))]


def throughput(batch: int, prompt_tokens: int = 128, output_tokens: int = 128) -> dict:
    """bfloat16 decode on the GPU: `batch` requests at once, every one `output_tokens` long."""
    llm, _ = _generate("cuda", "bfloat16", [[1, 2, 3]], 4, logprobs=None, max_num_seqs=batch)  # warm-up, compile
    prompts = [[(7 * i + j) % 40000 + 100 for j in range(prompt_tokens)] for i in range(batch)]
    from dataplane import SamplingParams

    params = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    return {"batch": batch, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def main(argv: list[str] | None = None) -> int:
    global MODEL
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt in the engine check")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--model", default=MODEL, help="alias, .gguf file or model directory (default: SmolLM2-135M)")
    args = ap.parse_args(argv)
    MODEL = args.model
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this host (torch.cuda.is_available() is False); nothing to check. "
              "Run it where a GPU is lent.")
        return 0
    from benchmarks.gpu_check_kernels import PRODUCTION, kernel_table, table_markdown
    from kernels.dispatch import triton_available, use_triton

    if not triton_available() or not use_triton("cuda"):
        print("gpu_check: CUDA is present but the Triton kernels are not in use (triton missing, or "
              "TESSERA_KERNELS=torch); install the 'gpu' extra and unset TESSERA_KERNELS.")
        return 1
    name = torch.cuda.get_device_name(0)
    seqs = engine_check(args.max_tokens)
    kernels = kernel_table(PRODUCTION, "cuda")
    speed = [] if args.no_throughput else [throughput(1), throughput(32)]
    ok = all(s.ok for s in seqs) and all(r.ok for r in kernels)

    lines = [f"# GPU check: {name}, {time.strftime('%Y-%m-%d')}", "", f"Model: `{MODEL}`.", "",
             f"Result: **{'pass' if ok else 'MISMATCH'}**", "",
             f"## Engine, float32, greedy {args.max_tokens} tokens: CUDA + Triton vs CPU + torch references", "",
             "| prompt | tokens compared | max logprob err | diverged at | near-tie | ok |", "|---|---:|---:|---:|---|---|"]
    lines += [f"| {s.prompt} | {s.compared} | {s.max_logprob_err:.1e} | {'–' if s.diverged_at is None else s.diverged_at}"
              f" | {'yes' if s.near_tie else 'no'} | {'yes' if s.ok else '**NO**'} |" for s in seqs]
    lines += ["", "## Kernels vs torch twins, production shapes", "", table_markdown(kernels)]
    if speed:
        lines += ["", "## Decode throughput, bfloat16, 128-token prompts, 128 output tokens", "",
                  "| batch | tokens | seconds | tok/s |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['batch']} | {r['tokens']} | {fmt(r['seconds'], 2)} | {fmt(r['tok_s'])} |" for r in speed]
    table = "\n".join(lines)
    print(table)
    write_results("gpu_check", {"env": environment(), "gpu": name, "model": MODEL, "ok": ok, "engine": [vars_of(s) for s in seqs],
                                "kernels": [vars_of(r) for r in kernels], "throughput": speed}, table)
    return 0 if ok else 1


def vars_of(obj: object) -> dict:
    return {f: getattr(obj, f) for f in obj.__slots__}  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
