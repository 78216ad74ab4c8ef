"""benchmarks/gpu_profile.py: counts per step and the bottleneck named, from hand-built profiles and from a
real (CPU) profile of the engine's padded decode step."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_profile import ProfileEntry, entries_from, profile_decode, summarize
from dataplane import LLM
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors


def _cpu(name, count, us):
    return ProfileEntry(name, count, us, 0.0, False)


def _gpu(name, count, us):
    return ProfileEntry(name, count, 0.0, us, True)


def test_an_eager_step_with_an_idle_gpu_is_host_bound():
    entries = [_cpu("aten::mm", 32 * 16, 3000), _cpu("cudaLaunchKernel", 400 * 16, 8000),
               _cpu("cuLaunchKernel", 100 * 16, 2000), _cpu("cudaStreamSynchronize", 16, 480),
               _cpu("cudaMemcpyAsync", 3 * 16, 300), _gpu("gemv_kernel", 500 * 16, 16_000),
               _gpu("Memcpy HtoD (Pinned -> Device)", 3 * 16, 160)]
    p = summarize(entries, batch=1, mode="eager", steps=16, wall_ms=20.0)
    assert p.launches == 500 and p.graph_launches == 0 and p.kernels == 500 and p.copies == 3 and p.syncs == 1
    assert p.gpu_ms == pytest.approx((16_000 + 160) / 1e3 / 16)
    assert p.sync_wait_ms == pytest.approx(0.03) and p.host_ms == pytest.approx(20.0 - 0.03)
    assert p.gpu_busy == pytest.approx(p.gpu_ms / 20.0)
    assert p.top_host[0] == ("cudaLaunchKernel", pytest.approx(0.5))
    assert p.verdict.startswith("host-bound: the GPU idles 95%") and "500 launches" in p.verdict
    assert "cudaLaunchKernel" in p.verdict and "cudaStreamSynchronize" not in p.verdict  # waiting is not work


def test_a_graph_step_with_a_busy_gpu_is_gpu_bound_and_names_its_kernels():
    entries = [_cpu("cudaGraphLaunch", 16, 200), _cpu("cudaStreamSynchronize", 16, 20_000),
               _gpu("paged_decode_attention", 30 * 16, 8_000), _gpu("gemm_bf16", 120 * 16, 22_000)]
    p = summarize(entries, batch=32, mode="graphs", steps=16, wall_ms=2.0, replays=16)
    assert p.launches == 1 and p.graph_launches == 1 and p.kernels == 150 and p.replays == 16
    assert p.gpu_busy == pytest.approx(30 / 16 / 2.0)
    assert p.verdict.startswith("GPU-bound") and p.verdict.index("gemm_bf16") < p.verdict.index("paged_decode")
    untraced = summarize(entries[:2], batch=32, mode="graphs", steps=16, wall_ms=2.0, on_gpu=True)
    assert "the profiler traced no kernel" in untraced.verdict  # not mistaken for a CPU run


def test_entries_from_a_real_profile():
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            x @ x
    mm = [e for e in entries_from(prof) if e.name == "aten::mm"]
    assert mm and mm[0].count == 5 and mm[0].self_cpu_us > 0 and not mm[0].on_device


def test_profile_decode_on_the_padded_step():
    args = tiny_args()
    llm = LLM("tiny", dtype="float32", preloaded=loaded(args, tiny_tensors(args)), block_size=4, max_num_seqs=8,
              max_num_batched_tokens=64, kv_cache_memory="1MiB", cuda_graphs="padded")
    p = profile_decode(llm, 3, 5, "graphs", steps=4, warm=2)
    assert p.batch == 3 and p.steps == 4 and p.replays == 4  # every profiled step a padded (graph) step
    assert p.wall_ms > 0 and p.gpu_ms == 0 and p.verdict.startswith("no GPU kernels recorded")
    assert not llm.core.has_unfinished()  # the requests were run to their end
