"""The kernel-vs-reference table of `benchmarks.gpu_check`, run on tiny shapes in Triton's interpreter.

The same code runs at production shapes on a GPU; here it proves the table calls every kernel
with arguments it accepts, and that a wrong kernel shows up as a failed row.
"""

from __future__ import annotations

import torch

from benchmarks.gpu_check_kernels import TINY, _compare, kernel_table, table_markdown


def test_every_kernel_matches_its_reference_on_tiny_shapes() -> None:
    rows = kernel_table(TINY, "cpu", dtypes=(torch.float32, torch.bfloat16))
    names = {r.kernel for r in rows}
    assert {"rms_norm+residual", "rotary (q)", "silu_and_mul", "paged_decode_attention", "prefill_attention",
            "bgmv_shrink", "sgmv_shrink", "bgmv_expand", "sgmv_expand", "fp8_linear", "awq_gemm",
            "paged_decode_attention (fp8 cache)", "prefill_attention (fp8 cache)", "rotary_write_kv (q)",
            "rotary_write_kv (k cache)", "rotary_write_kv (v cache)", "rotary_write_kv (k cache, fp8)",
            "rotary_write_kv (v cache, fp8)", "sample_full (token ids)"} <= names
    bad = [r for r in rows if not r.ok]
    assert not bad, table_markdown(bad)
    assert all(r.max_abs_err <= r.allowed for r in rows)


def test_a_wrong_output_is_a_failed_row() -> None:
    want = torch.randn(4, 8, dtype=torch.bfloat16)
    assert _compare("k", "4x8", want.clone(), want).ok
    off = want.clone()
    off[2, 3] += 0.5 + abs(float(want[2, 3]))
    row = _compare("k", "4x8", off, want)
    assert not row.ok and row.max_abs_err > row.allowed
    assert not _compare("k", "4x8", want.float(), want).ok  # a dtype change is a mismatch too
    assert "**NO**" in table_markdown([row])
