"""The engine's host cost per decode step: a tiny random model whose forward costs next to nothing,
decode steps at batch 1 / 32 / 128 / 256, per-step time.

    python -m benchmarks.step_overhead [--batches 1,32,128,256] [--steps 64] [--rounds 3] [--baseline REV]

Steady decode: every request has its prompt in the cache and decodes one token a step (`ignore_eos`).
What is timed is the step's critical path, the time before the next step can start: scheduling, the
runner's inputs, the forward, the sampler and the scheduler's update (`EngineCore.step_core`). The
output processing (detokenization, stop strings, the `RequestOutput`s the worker streams) runs off it,
on the worker's event loop (engine/async_llm.py); it is timed too, and reported beside (`total`). An
engine without that split (an older commit) is timed on `EngineCore.step(delta=True)`, which did both.

Two workloads: `greedy`, and `sampled` (temperature 0.8, top-p 0.95, top-k 40, half the requests
seeded): per-request sampling parameters are host work too.

Host time is the engine thread's CPU time (`time.thread_time`), the figure the targets use: on a
shared 2-core development host wall time moves with whatever else runs; it is reported too.

`--baseline REV` measures the same thing on another commit (a git worktree under the system's temp
folder, kept for the next run) in the same run, rounds interleaved, and reports the ratio: hosts
differ, and so does load, so only same-run ratios mean anything.

One thread (`torch.set_num_threads(1)`): the forward's arithmetic is not the subject. The model has
one layer, hidden size 64 and a 512-token vocabulary, so the step is the engine's Python and the
per-op cost of torch; on a GPU this is the time the GPU waits for the host.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("greedy", "sampled")
PROMPT_TOKENS = 24
VOCAB = 512


def _tiny_engine(max_seqs: int):
    """EngineCore over a one-layer random Llama and a word-level tokenizer (only public engine API, so
    the same code measures an older commit)."""
    import torch
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    from dataplane import LLM
    from dataplane.models.config import LlamaArgs
    from dataplane.models.loader import LoadedModel, build_llama
    from dataplane.models.tokenizer import Tokenizer

    args = LlamaArgs(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                     num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position=2048,
                     tie_word_embeddings=False, eos_token_ids=(1,))
    g = torch.Generator().manual_seed(0)
    h, i, d = args.hidden_size, args.intermediate_size, args.head_dim
    shapes = {"self_attn.q_proj": (args.num_heads * d, h), "self_attn.k_proj": (args.num_kv_heads * d, h),
              "self_attn.v_proj": (args.num_kv_heads * d, h), "self_attn.o_proj": (h, args.num_heads * d),
              "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    t = {"model.embed_tokens.weight": torch.randn(VOCAB, h, generator=g), "model.norm.weight": torch.ones(h),
         "lm_head.weight": torch.randn(VOCAB, h, generator=g) / h**0.5}
    for name, shape in shapes.items():
        t[f"model.layers.0.{name}.weight"] = torch.randn(*shape, generator=g) / shape[1] ** 0.5
    t["model.layers.0.input_layernorm.weight"] = torch.ones(h)
    t["model.layers.0.post_attention_layernorm.weight"] = torch.ones(h)
    rust = RustTokenizer(WordLevel({f"w{k}": k for k in range(VOCAB)}, unk_token="w0"))
    rust.pre_tokenizer = WhitespaceSplit()
    tok = Tokenizer(PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="w0", eos_token="w1"), (1,))
    loaded = LoadedModel(build_llama(args, t, torch.float32, torch.device("cpu")), tok, args, Path("tiny"))
    llm = LLM("tiny", dtype="float32", preloaded=loaded, block_size=16, max_num_seqs=max_seqs,
              max_num_batched_tokens=max(512, max_seqs * PROMPT_TOKENS), kv_cache_memory="64MiB")
    return llm.core


def _params(workload: str, k: int, max_tokens: int):
    from dataplane import SamplingParams

    if workload == "greedy":
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, top_k=40, ignore_eos=True,
                          seed=k if k % 2 else None)


def measure(batches: list[int], steps: int, workloads: tuple[str, ...] = WORKLOADS) -> dict[str, dict[str, dict]]:
    """{workload: {batch: {"wall": median step ms, "cpu": median step CPU ms of the engine thread}}} for
    decode steps of `batch` running requests."""
    import statistics

    import torch

    torch.set_num_threads(1)
    core = _tiny_engine(max(batches))
    forward = _time_forward(core.model)
    results: dict[str, dict[str, dict]] = {}
    for workload in workloads:
        for batch in batches:
            for k in range(batch):
                prompt = [2 + (k * 7 + j * 13) % (VOCAB - 2) for j in range(PROMPT_TOKENS)]
                rid, text, children = core.make_requests(prompt, _params(workload, k, steps + 8),
                                                         request_id=f"{workload}-{batch}-{k}")
                core.add(rid, text, children)
            while any(r.num_output_tokens == 0 for r in core.scheduler.running) or core.scheduler.waiting:
                core.step(delta=True)  # prefill, until every request decodes
            for _ in range(4):
                core.step(delta=True)  # warm: new shapes
            times, cpu, off, fwd = [], [], [], []
            split = getattr(core, "step_core", None)  # token ids out; outputs processed off the critical path
            for _ in range(steps):
                forward[0] = 0.0
                t0, c0 = time.perf_counter(), time.thread_time()
                if split is None:
                    core.step(delta=True)  # an engine that processes its outputs inside the step
                else:
                    outs = split()
                cpu.append(time.thread_time() - c0)
                times.append(time.perf_counter() - t0)
                fwd.append(forward[0])
                if split is None:
                    continue
                c1 = time.thread_time()
                core.process(outs, delta=True)
                off.append(time.thread_time() - c1)
            for k in range(batch):
                core.abort(f"{workload}-{batch}-{k}")
            while core.has_unfinished():
                core.step(delta=True)
            results.setdefault(workload, {})[str(batch)] = {
                "wall": statistics.median(times) * 1e3, "cpu": statistics.median(cpu) * 1e3,
                "forward": statistics.median(fwd) * 1e3,  # the model's own ops (hidden states, logits)
                "host": statistics.median([c - f for c, f in zip(cpu, fwd, strict=True)]) * 1e3,
                # the outputs' processing, off the step (0 where the step does it itself)
                "off": statistics.median(off) * 1e3 if off else 0.0,
                "total": statistics.median([c + o for c, o in zip(cpu, off, strict=True)] if off else cpu) * 1e3}
    return results


def _time_forward(model) -> list[float]:  # noqa: ANN001 - any commit's LlamaModel
    """Wrap the model's forward calls (the same two in every commit) to add their CPU time to slot 0."""
    spent = [0.0]
    for name in ("hidden_states", "logits"):
        inner = getattr(model, name)

        def timed(*args, _inner=inner, **kwargs):  # noqa: ANN202
            c0 = time.thread_time()
            try:
                return _inner(*args, **kwargs)
            finally:
                spent[0] += time.thread_time() - c0
        setattr(model, name, timed)
    return spent


def _baseline_tree(rev: str) -> Path:
    """A worktree of `rev`, kept between runs (its C++ kernels compile once)."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"tessera-baseline-{sha[:12]}"
    if not (tree / "dataplane").exists():
        subprocess.run(["git", "worktree", "add", "--detach", "--force", str(tree), sha], cwd=ROOT, check=True,
                       capture_output=True)
    return tree


def _child(tree: Path, batches: list[int], steps: int) -> dict[str, dict[str, float]]:
    """Run `measure` in a fresh process importing the engine from `tree` (this file's code runs there)."""
    # MKL's plain sgemm for the tiny projections in both trees: oneDNN's prepacked call costs ~60 µs at
    # these sizes, which would be the forward's arithmetic standing in for host time.
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "TESSERA_ONEDNN_LINEAR": "0"}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                          "--batches", ",".join(map(str, batches)), "--steps", str(steps)],
                         cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,32,128,256")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="best of this many runs of each tree, interleaved")
    ap.add_argument("--baseline", default=None, help="a git revision to measure in the same run")
    ap.add_argument("--name", default="step_overhead")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    if a.child:
        print(json.dumps(measure(batches, a.steps)))
        return

    from benchmarks.common import environment, write_results

    trees = {"this tree": ROOT}
    if a.baseline:
        trees[f"baseline {a.baseline}"] = _baseline_tree(a.baseline)
    best: dict[str, dict[str, dict[str, dict[str, float]]]] = {}  # tree -> workload -> batch -> metric -> ms
    for r in range(a.rounds):
        for label, tree in trees.items():
            got = _child(tree, batches, a.steps)
            print(f"round {r + 1} {label}: {got}", file=sys.stderr)
            for workload, per_batch in got.items():
                for b, metrics in per_batch.items():
                    slot = best.setdefault(label, {}).setdefault(workload, {}).setdefault(b, {})
                    for metric, ms in metrics.items():
                        slot[metric] = min(ms, slot.get(metric, float("inf")))
    env = environment()
    env["threads"] = 1
    data = {"environment": env, "batches": batches, "steps": a.steps, "rounds": a.rounds,
            "baseline": a.baseline, "step_ms": best}
    lines = [f"Per decode step (its critical path: `EngineCore.step_core`, or `step` where there is no split), "
             f"tiny random model, 1 thread, median of {a.steps} steps, best of {a.rounds} interleaved runs; "
             f"{env['cpu']} ({env['cpu_capability']}), {env['when']}. CPU time of the engine thread "
             "(`time.thread_time`); host time is that less the model's own forward (its hidden states and "
             "logits calls): what the step costs beyond the arithmetic, the time a GPU would wait.", ""]
    for metric, title in (("host", "**host time**: step CPU time − forward"), ("cpu", "step CPU time"),
                          ("forward", "forward CPU time (hidden states + logits)"), ("wall", "step wall time"),
                          ("total", "step + output processing, CPU time")):
        lines += [f"| {title} | tree | " + " | ".join(f"batch {b}: ms/step (µs/seq)" for b in batches) + " |",
                  "|---|---|" + "---:|" * len(batches)]
        for workload in WORKLOADS:
            for label in trees:
                per = best[label][workload]
                cells = [f"{per[str(b)][metric]:.2f} ({per[str(b)][metric] * 1e3 / b:.0f})" for b in batches]
                lines.append(f"| {workload} | {label} | " + " | ".join(cells) + " |")
            if a.baseline:
                base, ours = best[f"baseline {a.baseline}"][workload], best["this tree"][workload]
                ratios = {str(b): base[str(b)][metric] / ours[str(b)][metric] for b in batches}
                lines.append(f"| {workload} | **baseline ÷ this tree** | "
                             + " | ".join(f"**{ratios[str(b)]:.2f}×**" for b in batches) + " |")
                data.setdefault("speedup", {}).setdefault(metric, {})[workload] = ratios
        lines.append("")
    table = "\n".join(lines).rstrip() + "\n"
    write_results(a.name, data, table)
    print(table)


if __name__ == "__main__":
    main()
