"""The GPU check's verdicts and its markdown report, both read from the run's record (the JSON).

Written after every phase, so a run cut short still reports what it measured; a section whose phase
did not run says so. Targets (issue 28, on an H100 or H200, the same run):
- decode with CUDA graphs, whole generate call: batch 1 >= 600 tok/s, 32 >= 16,000, 128 >= 50,000,
  each also >= 60 % of the plain-torch CUDA-graph step at the same batch (benchmarks/plain_step.py);
- 8 LoRA adapters mixed in a batch of 32 under graphs >= 80 % of the base model's tok/s;
- identical greedy tokens with and without graphs (float32 and bfloat16; near-ties reported).
A target whose measurement is missing is "not measured", which is not a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.common import fmt

DECODE_TARGETS = {1: 600.0, 32: 16_000.0, 128: 50_000.0}
REFERENCE_SHARE = 0.60  # of the plain-torch graph step's tok/s
LORA_SHARE = 0.80  # mixed adapters against the base model


@dataclass(slots=True)
class Target:
    name: str
    ok: bool | None  # None: not measured
    detail: str

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[self.ok]
        return f"- **{mark}** {self.name}: {self.detail}"


def _by_batch(rows: list[dict], **match: object) -> dict[int, dict]:
    return {r["batch"]: r for r in rows if all(r.get(k) == v for k, v in match.items())}


def correctness_ok(record: dict) -> bool | None:
    """Every comparison that ran passed (None: none ran)."""
    results: list[bool] = []
    gve = record.get("graphs_vs_eager") or {}
    for part in gve.values():
        if isinstance(part, dict) and "checks" in part:
            results += [c["ok"] for c in part["checks"]] + [part.get("replays", 0) > 0]
    results += [s["ok"] for s in record.get("engine_vs_cpu") or []]
    results += [r["ok"] for r in record.get("kernels") or []]
    return all(results) if results else None


def targets(record: dict) -> list[Target]:
    sweep = record.get("sweep") or {}
    engine = _by_batch(sweep.get("engine", []), mode="graphs")
    reference = _by_batch(sweep.get("reference", []), graph=True)
    out = []
    for batch, need in DECODE_TARGETS.items():
        row, ref = engine.get(batch), reference.get(batch)
        if row is None:
            out.append(Target(f"batch {batch} >= {need:,.0f} tok/s (CUDA graphs)", None, "not measured"))
            out.append(Target(f"batch {batch} >= {REFERENCE_SHARE:.0%} of the plain-torch graph step", None,
                              "not measured"))
            continue
        share = row["tok_s"] / ref["tok_s"] if ref else None
        of_ref = f" ({share:.0%} of the plain-torch graph step's {ref['tok_s']:,.0f})" if ref else ""
        out.append(Target(f"batch {batch} >= {need:,.0f} tok/s (CUDA graphs)", row["tok_s"] >= need,
                          f"{row['tok_s']:,.0f} tok/s, {row['step_ms']:.2f} ms a decode step{of_ref}"))
        out.append(Target(f"batch {batch} >= {REFERENCE_SHARE:.0%} of the plain-torch graph step",
                          None if share is None else share >= REFERENCE_SHARE,
                          "no reference measured" if share is None else
                          f"{share:.0%} (decode step {row['step_ms']:.2f} ms against {ref['ms']:.2f} ms)"))
    lora = record.get("lora") or {}
    if lora.get("ratio") is not None:
        out.append(Target(f"{lora['adapters']} LoRA adapters mixed in a batch of {lora['batch']} >= {LORA_SHARE:.0%} "
                          "of base (CUDA graphs)", lora["ratio"] >= LORA_SHARE,
                          f"{lora['ratio']:.0%} ({lora['mixed_tok_s']:,.0f} against {lora['base_tok_s']:,.0f} tok/s)"))
    else:
        out.append(Target(f"LoRA adapters mixed in one batch >= {LORA_SHARE:.0%} of base", None, "not measured"))
    gve = record.get("graphs_vs_eager") or {}
    parts = {k: v for k, v in gve.items() if isinstance(v, dict) and "checks" in v}
    if parts:
        bad = [f"{k} prompt {c['prompt']}" for k, v in parts.items() for c in v["checks"] if not c["ok"]]
        vacuous = [k for k, v in parts.items() if not v.get("replays")]
        ties = sum(c["near_tie"] for v in parts.values() for c in v["checks"])
        detail = f"{', '.join(parts)}: " + ("all sequences identical" if not bad and not ties else
                                            f"{len(bad)} differ ({', '.join(bad)})" if bad else
                                            f"identical but for {ties} near-tie divergence(s)")
        if vacuous:
            detail += f"; NO decode step went through a graph in {', '.join(vacuous)}"
        out.append(Target("identical greedy tokens with and without graphs", not bad and not vacuous, detail))
    else:
        out.append(Target("identical greedy tokens with and without graphs", None, "not measured"))
    return out


def render(record: dict) -> str:
    rehearsal = record.get("device") == "cpu"
    title = record.get("gpu") or "no GPU"
    lines = [f"# GPU check: {title}, {record.get('date', '')}", ""]
    if rehearsal:
        lines += ["**A rehearsal on the CPU** (`--device cpu`, small sizes, the padded graph-safe step run eagerly): "
                  "it tests the check's code; its numbers are not measurements of anything.", ""]
    lines += [f"Model: `{record.get('model')}` (correctness); speed: `{record.get('speed_model')}` "
              f"({record.get('speed_layers')} layers, {record.get('speed_dtype')}).", ""]
    ok = correctness_ok(record)
    tg = targets(record)
    met = sum(t.ok is True for t in tg)
    lines += [f"Correctness: **{ {True: 'pass', False: 'MISMATCH', None: 'not run'}[ok] }**; "
              f"targets met: **{met} of {len(tg)}**", "", "## Targets", ""]
    lines += [t.line() for t in tg]
    lines += ["", "## Phases", "", "| phase | status | seconds | budget |", "|---|---|---:|---:|"]
    lines += [f"| {n} | {p['status']} | {p['seconds']} | {p['budget']} |" for n, p in record.get("phases", {}).items()]
    for section in (_findings, _graphs_vs_eager, _sweep, _profile, _lora, _prefill, _roofline, _engine_vs_cpu,
                    _kernels):
        lines += section(record)
    return "\n".join(lines)


def _findings(record: dict) -> list[str]:
    found = record.get("findings") or []
    return ["", "## Findings of this run", ""] + [f"- {f}" for f in found] if found else []


def _graphs_vs_eager(record: dict) -> list[str]:
    gve = record.get("graphs_vs_eager")
    if not gve:
        return []
    lines = ["", "## CUDA graphs against eager: greedy tokens and logprobs", ""]
    for name, part in gve.items():
        if not isinstance(part, dict) or "checks" not in part:
            continue
        lines += [f"**{name}**: tolerance {part['tolerance']:.0e}, {part['replays']} graph steps, "
                  f"{part['prompts']} prompts x {part['max_tokens']} tokens{part.get('note', '')}", "",
                  "| prompt | tokens compared | max logprob err | diverged at | near-tie | ok |",
                  "|---|---:|---:|---:|---|---|"]
        lines += [f"| {c['prompt']} | {c['compared']} | {c['max_logprob_err']:.1e} | "
                  f"{'–' if c['diverged_at'] is None else c['diverged_at']} | {'yes' if c['near_tie'] else 'no'} | "
                  f"{'yes' if c['ok'] else '**NO**'} |" for c in part["checks"]]
        lines.append("")
    if gve.get("warmup"):
        w = gve["warmup"]
        lines.append(f"Warm-up (engine/warmup.py) of the graphs engine: {w['steps']} steps in {w['seconds']:.1f} s, "
                     f"{w['cuda_graphs']} graphs for {w['sizes']} sizes, capture {w['graph_capture_seconds']:.1f} s.")
    return lines


def _sweep(record: dict) -> list[str]:
    sweep = record.get("sweep")
    if not sweep:
        return []
    p = sweep.get("params", {})
    lines = ["", f"## Decode sweep: {p.get('prompt_len')}-token prompts, {p.get('output_tokens')} greedy tokens "
             "(ignore_eos), the whole generate call", ""]
    cap = sweep.get("capture")
    if cap:
        lines += [f"CUDA graphs: {cap['graphs']} captured in {cap['capture_seconds']:.1f} s, "
                  f"{cap['memory_bytes'] / 2**20:.0f} MiB (sizes {cap.get('sizes')}).", ""]
    graphs = _by_batch(sweep.get("engine", []), mode="graphs")
    eager = _by_batch(sweep.get("engine", []), mode="eager")
    ref_g = _by_batch(sweep.get("reference", []), graph=True)
    ref_e = _by_batch(sweep.get("reference", []), graph=False)
    lines += ["| batch | graphs tok/s | step ms | eager tok/s | step ms | graphs / eager | plain-torch graph tok/s | "
              "ms | engine / plain graph (tok/s) | (step) | plain-torch eager tok/s | graph steps |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in sorted(set(graphs) | set(eager) | set(ref_g)):
        g, e, rg, re = graphs.get(b), eager.get(b), ref_g.get(b), ref_e.get(b)
        lines.append("| " + " | ".join([
            str(b), _n(g, "tok_s"), _n(g, "step_ms", 2), _n(e, "tok_s"), _n(e, "step_ms", 2),
            _ratio(g, e, "tok_s"), _n(rg, "tok_s"), _n(rg, "ms", 3), _ratio(g, rg, "tok_s"),
            _ratio(rg, g, "ms", "step_ms"), _n(re, "tok_s"), "–" if g is None else str(g.get("replays"))]) + " |")
    sampled = _by_batch(sweep.get("engine", []), mode="graphs, top-p")
    if sampled:
        knobs = ", ".join(f"{k} {v}" for k, v in (sweep.get("sampled") or {}).items())
        lines += ["", f"Sampled ({knobs}, seeded; the whole-vocabulary draw), under graphs:", "",
                  "| batch | tok/s | step ms | greedy step ms | sampled / greedy (tok/s) |", "|---:|---:|---:|---:|---:|"]
        for b, r in sorted(sampled.items()):
            g = graphs.get(b)
            lines.append(f"| {b} | {_n(r, 'tok_s')} | {_n(r, 'step_ms', 2)} | {_n(g, 'step_ms', 2)} | "
                         f"{_ratio(r, g, 'tok_s')} |")
    return lines


def _profile(record: dict) -> list[str]:
    rows = record.get("profile")
    if not rows:
        return []
    lines = ["", "## Where a decode step goes (torch profiler)", "",
             "| batch | mode | wall ms | GPU ms | GPU busy | host ms | launches | kernels | copies | syncs | graph steps |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['mode']} | {r['wall_ms']:.2f} | {r['gpu_ms']:.2f} | {r['gpu_busy']:.0%} | "
              f"{r['host_ms']:.2f} | {r['launches']:.0f} | {r['kernels']:.0f} | {r['copies']:.0f} | {r['syncs']:.0f} | "
              f"{r['replays'] if r['replays'] is not None else '–'}/{r['steps']} |" for r in rows]
    lines += ["", "Next bottleneck, as the run names it:", ""]
    lines += [f"- batch {r['batch']}, {r['mode']}: {r['verdict']}" for r in rows]
    return lines


def _lora(record: dict) -> list[str]:
    lora = record.get("lora")
    if not lora:
        return []
    lines = ["", f"## LoRA: {lora['adapters']} adapters (rank {lora['rank']}) mixed in a batch of {lora['batch']}, "
             "against the base model, the same engine", "", "| run | tok/s | step ms | graph steps |",
             "|---|---:|---:|---:|"]
    lines += [f"| {r['mode']} | {r['tok_s']:,.0f} | {r['step_ms']:.2f} | {r['replays']} |" for r in lora["rows"]]
    return lines


def _prefill(record: dict) -> list[str]:
    rows = record.get("prefill")
    if not rows:
        return []
    lines = ["", "## Prefill: one prompt, one output token, the whole call", "", "| tokens | ms | tok/s |",
             "|---:|---:|---:|"]
    lines += [f"| {r['tokens']} | {1000 * r['seconds']:.1f} | {r['tok_s']:,.0f} |" for r in rows]
    return lines


def _roofline(record: dict) -> list[str]:
    roof = record.get("roofline")
    if not roof:
        return []
    c = roof["ceilings"]
    lines = ["", "## Roofline", "",
             f"Ceilings measured in this run on {c['device']}: {c['bandwidth'] / 1e12:.2f} TB/s (copy, read + write), "
             f"{c['peak_flops'] / 1e12:.0f} TFLOP/s ({c['dtype']} matmul); ridge {c['peak_flops'] / c['bandwidth']:.0f} "
             f"FLOP/byte. {roof.get('png', '')}", ""]
    if roof.get("png_file"):
        lines += [f"![roofline]({roof['png_file']})", ""]
    lines += ["| series | point | FLOP/byte | TFLOP/s | tok/s | regime | of its roof |", "|---|---|---:|---:|---:|---|---:|"]
    lines += [f"| {p['series']} | {p['label']} | {p['intensity']:.1f} | {p['tflops']:.2f} | {p['tok_s']:,.0f} | "
              f"{p['regime']} | {p['of_roof']:.0%} |" for p in roof["points"]]
    return lines


def _engine_vs_cpu(record: dict) -> list[str]:
    seqs = record.get("engine_vs_cpu")
    if not seqs:
        return []
    lines = ["", "## Engine, float32, greedy: CUDA + Triton vs CPU + torch references", "",
             "| prompt | tokens compared | max logprob err | diverged at | near-tie | ok |", "|---|---:|---:|---:|---|---|"]
    lines += [f"| {s['prompt']} | {s['compared']} | {s['max_logprob_err']:.1e} | "
              f"{'–' if s['diverged_at'] is None else s['diverged_at']} | {'yes' if s['near_tie'] else 'no'} | "
              f"{'yes' if s['ok'] else '**NO**'} |" for s in seqs]
    return lines


def _kernels(record: dict) -> list[str]:
    rows = record.get("kernels")
    if not rows:
        return []
    lines = ["", "## Kernels vs torch twins, production shapes", "",
             "| kernel | dtype | shape | max abs err | allowed | ok |", "|---|---|---|---:|---:|---|"]
    lines += [f"| {r['kernel']} | {r['dtype']} | {r['shape']} | {r['max_abs_err']:.2e} | {r['allowed']:.2e} | "
              f"{'yes' if r['ok'] else '**NO**'} |" for r in rows]
    return lines


def _n(row: dict | None, key: str, digits: int = 0) -> str:
    if row is None or row.get(key) is None:
        return "–"
    return f"{row[key]:,.{digits}f}" if digits == 0 else fmt(row[key], digits)


def _ratio(a: dict | None, b: dict | None, key: str, key_b: str | None = None) -> str:
    if a is None or b is None or not b.get(key_b or key):
        return "–"
    return f"{a[key] / b[key_b or key]:.2f}x"
