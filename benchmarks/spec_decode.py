"""Prompt-lookup speculative decoding: decode speed with and without it, at batch 1 and at 32.

    python -m benchmarks.spec_decode [--quick] [--tokens K]

Input-grounded task: SmolLM2-135M-Instruct (chat template) is asked to correct the typos in a
paragraph it is given and return the whole text, so most of its answer copies the prompt. Greedy
(outputs are the same with and without speculation, so both sides generate the same tokens).
An open-ended task (a story, nothing to copy) shows the cost when drafts are rarely right.

Batch 1: each prompt alone, speculation off then on, alternating per prompt so that load drifting
on a shared machine hits both sides alike. Decode tok/s = (tokens - 1) / (finish - first token);
CPU ms/token = this process's CPU time (all its threads) per generated token, prefill included:
less sensitive than wall time to other work on the host.
32 concurrent: all prompts at once, aggregate tokens / wall time, with the default proposal cut-off
(speculative_max_running, so no drafts at 32), with none at all, and with drafts forced at 32 (to
show why the cut-off exists).
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import environment, fmt, write_results
from dataplane import SamplingParams
from dataplane.config import ModelConfig
from dataplane.engine.llm import LLM
from dataplane.models.loader import load_configured

MODEL = "smollm2-135m-instruct"
TEXTS = [
    "The river flows thru the old town, past the mill and the church, untill it reaches the sea. In summer "
    "the children swim near the bridge, and in winter the water freezes along the banks.",
    "Our team ships a new release every two weeks. Each release is tested on three machines, reviewed by "
    "two engineers, and anounced on the mailing list with a short sumary of the changes.",
    "To make bread, mix flour, water, salt and yeast. Knead the dough for ten minutes, let it rise for an "
    "hour, shape it, and bake it in a hot oven untill the crust is golden brown.",
    "The library opens at nine in the morning and closes at six in the evening. Visitors may borow up to "
    "five books at a time and keep them for three weeks before returning them.",
    "A good password is long, unique and hard to guess. Store it in a password manager, never share it by "
    "email, and turn on two-factor authentification wherever the service offers it.",
    "The train to the coast leaves every hour from platform four. The journey takes about two hours, and "
    "the last train back departs at ten past eleven in the evening, exept on Sundays.",
    "Water boils at one hundred degrees Celsius at sea level. At higher altitudes the air pressure is lower, "
    "so water boils at a lower temperture and food takes longer to cook.",
    "The museum's new exhibition shows paintings from the early twentieth century. It runs untill the end "
    "of March, and guided tours are offered every Saturday afternoon at three o'clock.",
]
STORIES = ["Write a short story about a lighthouse keeper.", "Write a short story about a lost dog.",
           "Describe a walk through a forest in autumn.", "Write a poem about the sea at night."]


def edit_prompt(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Correct the spelling mistakes in this text and return the whole "
                                        f"corrected text, nothing else:\n\n{text}"}]


def batch1(llm: LLM, prompts: list[list[int]], max_tokens: int, k: int) -> dict:
    """Alternate off/on per prompt; returns per-mode decode tok/s and acceptance."""
    sides: dict[str, dict] = {"off": {"tokens": 0, "decode_s": 0.0, "wall_s": 0.0, "cpu_s": 0.0},
                              "on": {"tokens": 0, "decode_s": 0.0, "wall_s": 0.0, "cpu_s": 0.0}}
    before = llm.core.stats()
    same = True
    for p in prompts:
        got = {}
        for side, spec in (("off", 0), ("on", k)):
            t0, c0 = time.perf_counter(), time.process_time()
            out = llm.generate([p], SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                   speculative_tokens=spec))[0]
            s = sides[side]
            s["wall_s"] += time.perf_counter() - t0
            s["cpu_s"] += time.process_time() - c0  # this process's CPU: robust to other load on the host
            m = out.metrics
            n = len(out.outputs[0].token_ids)
            s["tokens"] += n - 1
            s["all_tokens"] = s.get("all_tokens", 0) + n
            s["decode_s"] += m.finished_time - m.first_token_time
            got[side] = out.outputs[0].token_ids
        same &= got["off"] == got["on"]
    after = llm.core.stats()
    drafts = after.spec_num_draft_tokens - before.spec_num_draft_tokens
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    verifies = after.spec_num_drafts - before.spec_num_drafts
    for s in sides.values():
        s["decode_tok_s"] = s["tokens"] / s["decode_s"]
        s["cpu_ms_per_token"] = 1000 * s["cpu_s"] / s["all_tokens"]
    return {**sides, "speedup": sides["on"]["decode_tok_s"] / sides["off"]["decode_tok_s"],
            "cpu_speedup": sides["off"]["cpu_ms_per_token"] / sides["on"]["cpu_ms_per_token"],
            "acceptance_rate": accepted / drafts if drafts else None,
            "mean_accepted_per_verify": accepted / verifies if verifies else None,
            "outputs_identical": same}


def concurrent(llm: LLM, prompts: list[list[int]], max_tokens: int, spec: int | None) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, speculative_tokens=spec)
    before = llm.core.stats()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    after = llm.core.stats()
    return {"requests": len(prompts), "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "draft_tokens": after.spec_num_draft_tokens - before.spec_num_draft_tokens,
            "accepted_tokens": after.spec_num_accepted_tokens - before.spec_num_accepted_tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer prompts and tokens")
    ap.add_argument("--tokens", type=int, default=4, help="draft tokens per step (k)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto", help="model dtype (auto: bf16 where the CPU has it, else float32)")
    ap.add_argument("--prompts", type=int, default=8, help="edit prompts at batch 1 (stories: half as many)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        # On a host shared with other work, one thread per process avoids parallel regions waiting for a
        # descheduled sibling thread (batch-1 steps slowed many-fold under a load average of 6-8).
        torch.set_num_threads(args.threads)
    loaded = load_configured(ModelConfig(model=MODEL, dtype=args.dtype), progress=False)
    common = dict(preloaded=loaded, dtype=args.dtype, kv_cache_memory="1GiB", max_num_seqs=64)
    llm = LLM(MODEL, speculative_ngram_tokens=args.tokens, **common)  # default cut-off: speculative_max_running
    forced = LLM(MODEL, speculative_ngram_tokens=args.tokens, speculative_max_running=64, **common)
    tok = llm.tokenizer
    edits = [tok.apply_chat_template(edit_prompt(t)) for t in TEXTS]
    stories = [tok.apply_chat_template([{"role": "user", "content": s}]) for s in STORIES]
    if args.quick:
        args.prompts, args.max_tokens = 3, min(args.max_tokens, 96)
    many = [edits[i % len(edits)] for i in range(32)]
    edits, stories = edits[: args.prompts], stories[: max(1, args.prompts // 2)]
    for engine in (llm, forced):  # warm-up: the shapes of a prefill, a decode, a verify step, a batch of 32
        engine.generate([edits[0]], SamplingParams(max_tokens=24, temperature=0.0))
        engine.generate(many, SamplingParams(max_tokens=8, temperature=0.0))
    results = {"env": environment(), "model": MODEL, "dtype": str(loaded.model.dtype), "draft_tokens_k": args.tokens, "max_tokens": args.max_tokens,
               "speculative_max_running": llm.core.scheduler.config.speculative.max_running,
               "edit_batch1": batch1(llm, edits, args.max_tokens, args.tokens),
               "story_batch1": batch1(llm, stories, args.max_tokens, args.tokens),
               "edit_32": {"off": concurrent(llm, many, 64, 0), "default": concurrent(llm, many, 64, None),
                           "forced_on": concurrent(forced, many, 64, None)}}
    env = results["env"]
    e1, s1, c = results["edit_batch1"], results["story_batch1"], results["edit_32"]
    lines = [
        "# Prompt-lookup speculative decoding",
        "",
        f"`python -m benchmarks.spec_decode{' --quick' if args.quick else ''}"
        f"{'' if args.dtype == 'auto' else ' --dtype ' + args.dtype}{f' --threads {args.threads}' if args.threads else ''}"
        f"` — {env['cpu']}, "
        f"{env['threads']} threads, {env['when'][:10]}; {MODEL}, dtype {args.dtype} ({results['dtype']}), "
        f"k = {args.tokens} draft tokens, "
        f"n-gram 2..4, greedy.",
        "",
        "| task | batch | off, tok/s | on, tok/s | speed-up | CPU ms/token off → on | CPU speed-up | acceptance "
        "| accepted per verify | same output |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in (("edit a given text", e1), ("open-ended story", s1)):
        lines.append(f"| {name} | 1 | {fmt(r['off']['decode_tok_s'])} | {fmt(r['on']['decode_tok_s'])} | "
                     f"{r['speedup']:.2f}x | {fmt(r['off']['cpu_ms_per_token'])} → {fmt(r['on']['cpu_ms_per_token'])} | "
                     f"{r['cpu_speedup']:.2f}x | {fmt(r['acceptance_rate'], 2)} | {fmt(r['mean_accepted_per_verify'], 2)} | "
                     f"{r['outputs_identical']} |")
    lines += [
        "",
        f"32 concurrent (edit task, {c['off']['requests']} requests x 64 tokens, ignore_eos), aggregate tok/s:",
        "",
        "| mode | tok/s | draft tokens | accepted |",
        "|---|---:|---:|---:|",
    ]
    for name, key in (("off", "off"), (f"on, default cut-off (drafts only while <= "
                                       f"{results['speculative_max_running']} running)", "default"),
                      ("on, forced at 32 (cut-off lifted)", "forced_on")):
        lines.append(f"| {name} | {fmt(c[key]['tok_s'])} | {c[key]['draft_tokens']} | {c[key]['accepted_tokens']} |")
    lines += ["", "Same output: greedy tokens equal with and without drafts for every prompt. They are in float32;",
              "in bfloat16 a verify step's multi-row matmuls round differently from a one-row decode, so a",
              "near-tie between two tokens (bf16 logits tie exactly at times) can go either way and the texts part."]
    table = "\n".join(lines)
    suffix = ("" if args.dtype == "auto" else "_" + args.dtype) + (f"_{args.threads}t" if args.threads else "") + (
        "-quick" if args.quick else "")
    write_results("spec_decode" + suffix, results, table)
    print(table)


if __name__ == "__main__":
    main()
