"""benchmarks/gpu_sweep.py and gpu_lora.py on a tiny model: the rows the GPU check records, CPU-side."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_lora import add_adapters, mixed, write_adapter
from benchmarks.gpu_phases import Budget
from benchmarks.gpu_sweep import build_llm, decode_sweep, prefill_sweep, reference_sweep, synthetic_prompts
from dataplane.config import LORA_TARGET_MODULES
from dataplane.lora.adapter import load_adapter
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors


@pytest.fixture(scope="module")
def tiny():
    args = tiny_args()
    return loaded(args, tiny_tensors(args, seed=2))


def test_synthetic_prompts_are_distinct_and_inside_the_vocabulary():
    rows = synthetic_prompts(16, 9, vocab=49152, salt=3)
    assert len(rows) == 16 and all(len(r) == 9 for r in rows) and len({tuple(r) for r in rows}) == 16
    assert all(100 <= t < 49152 for r in rows for t in r)
    assert synthetic_prompts(2, 4, 49152, salt=1) != synthetic_prompts(2, 4, 49152, salt=2)


def test_decode_rows_graphs_and_eager(tiny):
    rows = []
    for mode in ("graphs", "eager"):
        llm = build_llm(tiny, "cpu", mode, max_num_seqs=8, max_num_batched_tokens=64, kv_cache_memory="1MiB")
        decode_sweep(llm, mode, [1, 3], prompt_len=4, output_tokens=5, budget=Budget(300), out=rows)
    assert [(r["mode"], r["batch"]) for r in rows] == [("graphs", 1), ("graphs", 3), ("eager", 1), ("eager", 3)]
    for r in rows:
        assert r["tokens"] == 5 * r["batch"] and r["tok_s"] == pytest.approx(r["tokens"] / r["call_s"])
        assert r["step_ms"] == pytest.approx(1000 * max(r["call_s"] - r["first_s"], 0) / 4)
    # every decode step of the timed call went through the padded graph step: 4 after the prefill's sample
    assert [r["replays"] for r in rows] == [4, 4, None, None]


def test_a_spent_budget_stops_the_sweep(tiny):
    rows = []
    llm = build_llm(tiny, "cpu", "eager", max_num_seqs=8, max_num_batched_tokens=64, kv_cache_memory="1MiB")
    decode_sweep(llm, "eager", [1, 2], prompt_len=4, output_tokens=3, budget=Budget(0.0), out=rows)
    assert rows == []


def test_prefill_and_reference_rows(tiny):
    rows = []
    llm = build_llm(tiny, "cpu", "graphs", max_num_seqs=4, max_num_batched_tokens=256, kv_cache_memory="1MiB")
    prefill_sweep(llm, [16, 40, 10_000], Budget(300), rows)
    limit = llm.core.max_model_len - 1
    assert [r["tokens"] for r in rows] == [16, 40, limit]  # a length past the model's is cut to it
    ref = []
    reference_sweep(tiny_args(), "cpu", torch.float32, [1, 2], 12, Budget(300), ref, graph=False, eager_iters=2)
    assert [(r["batch"], r["ctx"], r["graph"]) for r in ref] == [(1, 12, False), (2, 12, False)]


def test_adapters_written_as_peft_writes_them_load_and_mix(tmp_path, tiny):
    args = tiny_args()
    size = write_adapter(tmp_path / "a", args, rank=4, seed=1)
    adapter = load_adapter("a", tmp_path / "a", args, max_rank=8, dtype=torch.float32, interleave_qk=True)
    assert adapter.rank == 4 and adapter.target_modules == LORA_TARGET_MODULES and adapter.num_bytes > 0
    assert size == sum(2 * 4 * (i + o) for i, o in _module_dims(args)) * args.num_layers  # bf16 A and B
    llm = build_llm(tiny, "cpu", "graphs", max_num_seqs=8, max_num_batched_tokens=64, kv_cache_memory="1MiB",
                    enable_lora=True, max_loras=2, max_lora_rank=4)
    names = add_adapters(llm, tmp_path / "adapters", args, 2, 4)
    assert names == ["lora0", "lora1"] and {a.name for a in llm.list_adapters()} == set(names)
    assert mixed(names, 5) == ["lora0", "lora1", "lora0", "lora1", "lora0"]
    rows = []
    decode_sweep(llm, "mixed", [4], 4, 3, Budget(300), rows, adapters_for=lambda b: mixed(names, b))
    assert rows[0]["replays"] == 2 and rows[0]["tokens"] == 12


def _module_dims(args):
    h, q, kv, i = args.hidden_size, args.q_size, args.kv_size, args.intermediate_size
    return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
