"""benchmarks/roofline.py: the work counted per step, the regime of each point, and the picture's data
(the PNG itself needs matplotlib, which the GPU machines have; here its absence is a message)."""

from __future__ import annotations

import sys

import pytest

from benchmarks.roofline import (
    Ceilings,
    Point,
    decode_work,
    matmul_params,
    measure_ceilings,
    plot,
    plot_data,
    prefill_work,
)
from dataplane.models.config import LlamaArgs

SMOLLM2 = LlamaArgs(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                    num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0, max_position=8192,
                    tie_word_embeddings=True)
SMALL = LlamaArgs(vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                  head_dim=2, rms_norm_eps=1e-5, rope_theta=1e4, max_position=64, tie_word_embeddings=True)
H100 = Ceilings("H100", bandwidth=3.0e12, peak_flops=790e12, dtype="bfloat16")


def test_work_counted_by_hand_on_a_small_model():
    assert matmul_params(SMALL) == 4 * 8 + 4 * 4 + 2 * 8 * 4 + 8 * 4 + 10 * 4  # qkv, o, gate-up, down, head
    w = decode_work(SMALL, batch=1, ctx=5, dtype_bytes=2)
    assert w.flops == 2 * 184 + 4 * 5 * 4  # the projections, then QK^T and PV over 5 keys for 4 query dims
    # weights 184 x 2 B, K/V read for 5 tokens and written for 1 (8 B each), 136 activation elements x 2 B
    assert w.bytes == 368 + 40 + 8 + 272
    p = prefill_work(SMALL, tokens=3, dtype_bytes=2)
    assert p.flops == 2 * 3 * 184 + 4 * 6 * 4  # 3 tokens, 6 causal query-key pairs
    assert p.bytes == 368 + 3 * 8 + 3 * 272


def test_smollm2_decode_is_memory_bound_to_256_and_long_prefills_compute_bound():
    one = decode_work(SMOLLM2, 1, 96)
    assert 0.9 < one.intensity < 1.1  # 2 FLOPs per 2-byte weight: one FLOP a byte at batch 1
    ai = [decode_work(SMOLLM2, b, 96).intensity for b in (1, 8, 32, 128, 256)]
    assert ai == sorted(ai) and ai[-1] < H100.ridge
    pre = [prefill_work(SMOLLM2, n).intensity for n in (128, 512, 2048, 8192)]
    assert pre == sorted(pre) and pre[0] < H100.ridge < pre[-1]


def test_points_regime_and_fraction_of_the_roof():
    w = decode_work(SMOLLM2, 32, 96)
    slow = Point("engine", "b32", w, seconds=w.bytes / H100.bandwidth * 4, tokens=32)  # a quarter of the roof
    assert slow.regime(H100) == "memory-bound" and slow.of_roof(H100) == pytest.approx(0.25)
    assert slow.tok_s == pytest.approx(32 / slow.seconds)
    big = prefill_work(SMOLLM2, 8192)
    fast = Point("prefill", "8k", big, seconds=big.flops / H100.peak_flops * 2, tokens=8192)
    assert fast.regime(H100) == "compute-bound" and fast.of_roof(H100) == pytest.approx(0.5)
    row = fast.row(H100)
    assert row["regime"] == "compute-bound" and row["tflops"] == pytest.approx(H100.peak_flops / 2e12)


def test_plot_data_draws_the_roof_over_every_point():
    pts = [Point("engine", "b1", decode_work(SMOLLM2, 1, 96), 1e-3, 1),
           Point("prefill", "8k", prefill_work(SMOLLM2, 8192), 0.05, 8192)]
    data = plot_data(pts, H100)
    xs = [x for x, _ in data["roof"]]
    assert xs == sorted(xs) and xs[0] < pts[0].work.intensity and xs[-1] > pts[1].work.intensity
    for x, y in data["roof"]:
        assert y == pytest.approx(min(H100.peak_flops, H100.bandwidth * x) / 1e12)
    assert data["series"]["engine"] == [(pts[0].work.intensity, pts[0].flops_per_s / 1e12, "b1")]
    assert data["ridge"] == pytest.approx(H100.ridge)


def test_png_written_with_matplotlib_or_skipped_with_a_message(tmp_path, monkeypatch):
    pts = [Point("engine", "b1", decode_work(SMOLLM2, 1, 96), 1e-3, 1)]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        assert "written" in plot(pts, H100, tmp_path / "r.png", "t") and (tmp_path / "r.png").stat().st_size > 1000
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    message = plot(pts, H100, tmp_path / "none.png", "t")
    assert "matplotlib is not installed" in message and not (tmp_path / "none.png").exists()


def test_ceilings_measured_on_the_cpu():
    c = measure_ceilings("cpu", copy_mib=8, matmul_n=128, repeats=2)
    assert c.device == "cpu" and c.bandwidth > 1e8 and c.peak_flops > 1e8 and c.ridge > 0
