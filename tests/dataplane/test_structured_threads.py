"""The grammar-mask thread runs no torch op, so it never gets an OpenMP pool of its own.

libgomp keeps a pool for every thread that ever ran a parallel region; once it manages more threads
than the machine has CPUs, every barrier of every later step sleeps instead of spinning
(dataplane/engine/passing_thread.py). Allocating a 32-row bitmask (a parallel fill) on the mask
thread did that: batch-1 decode fell from 47 to 32 tok/s after one such step, for the engine's life
(SmolLM2 bf16, 2 threads, AMD EPYC with AVX-512 BF16, 2026-11-26)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataplane import LLM, SamplingParams
from dataplane.structured.params import StructuredOutputs
from tests.dataplane.conftest import MODEL


def process_threads() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")
def test_a_32_row_structured_step_starts_no_pool_on_the_mask_thread(smollm_fp32):
    if torch.get_num_threads() < 2:
        pytest.skip("with one torch thread no OpenMP pool has workers to count")
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory="64MiB", max_num_seqs=32)
    spec = StructuredOutputs(regex="[a-z]{6}")
    prompts = [f"Write a word ({i})." for i in range(32)]
    greedy = SamplingParams(max_tokens=4, temperature=0)
    # Every thread but the pool's: the mask thread and the compiler's (one constrained row), the engine
    # thread's own pool at 32 rows.
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0, structured=spec))
    llm.generate(prompts, greedy)
    before = process_threads()
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0, structured=spec))
    assert all(len(o.outputs[0].token_ids) >= 1 and o.outputs[0].text.isalpha() for o in outs)
    assert process_threads() == before  # no OpenMP workers for the mask thread


def test_a_runner_without_a_grammar_backend_fails_only_the_constrained_request(smollm_fp32):
    llm = LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory="64MiB")
    llm.core.runner.structured = None
    constrained, plain = llm.generate(["a", "b"], [
        SamplingParams(max_tokens=3, temperature=0, structured=StructuredOutputs(regex="[a-z]+")),
        SamplingParams(max_tokens=3, temperature=0)])
    assert (constrained.outputs[0].text, constrained.outputs[0].finish_reason) == ("", "error")
    assert plain.outputs[0].finish_reason == "length" and len(plain.outputs[0].token_ids) == 3
