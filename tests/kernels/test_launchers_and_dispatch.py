"""Launchers refuse bad arguments with messages that name the problem; dispatch picks the right path."""

from __future__ import annotations

import pytest
import torch

from kernels import dispatch
from kernels import reference as R
from kernels.awq_gemm import awq_gemm
from kernels.awq_layout import awq_quantize
from kernels.fp8_gemm import fp8_linear
from kernels.lora_expand import bgmv_expand
from kernels.lora_shrink import sgmv_shrink
from kernels.paged_attention import paged_decode_attention
from kernels.prefill_attention import prefill_attention
from kernels.rms_norm import rms_norm
from kernels.rotary import rotary_embedding
from kernels.silu_and_mul import silu_and_mul
from tests.kernels.helpers import paged_cache

I32 = torch.int32


def _decode_args(**override):
    kc, vc, tables = paged_cache(4, 16, 3, 64, torch.float32, [5, 9])
    args = dict(q=torch.randn(2, 9, 64), key_cache=kc, value_cache=vc, block_tables=tables,
                context_lens=torch.tensor([5, 9], dtype=I32), scale=0.125)
    return {**args, **override}


@pytest.mark.parametrize("override,message", [
    (dict(q=torch.randn(2, 8, 64)), "multiple of num_kv_heads"),
    (dict(q=torch.randn(2, 9, 64).half()), "dtypes must match"),
    (dict(q=torch.randn(2, 9, 128)[:, :, ::2]), "unit stride"),
    (dict(context_lens=torch.tensor([5, 9])), "context_lens must have dtype in \\(int32\\)"),
    (dict(block_tables=torch.zeros(3, 1, dtype=I32)), r"block_tables must have shape \[2, \*\]"),
    (dict(q=torch.randn(2, 9)), "q must have 3 dimensions"),
])
def test_decode_attention_rejects(override, message) -> None:
    with pytest.raises(ValueError, match=f"paged_decode_attention: .*{message}"):
        paged_decode_attention(**_decode_args(**override))


def test_prefill_rejects_mismatched_cu_seqlens() -> None:
    args = _decode_args()
    args.pop("context_lens")
    with pytest.raises(ValueError, match=r"cu_seqlens_q must have shape \[3\]"):
        prefill_attention(**args, cu_seqlens_q=torch.tensor([0, 2], dtype=I32),
                          context_lens=torch.tensor([5, 9], dtype=I32))


@pytest.mark.parametrize("call,message", [
    (lambda: rms_norm(torch.randn(2, 8), torch.ones(7)), r"weight must have shape \[8\]"),
    (lambda: rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6, torch.randn(2, 8).half()), "dtypes must match"),
    (lambda: rms_norm(torch.randn(2, 8, 2)[..., 0], torch.ones(8)), "unit stride"),
    (lambda: silu_and_mul(torch.randn(2, 7)), "must be even"),
    (lambda: silu_and_mul(torch.randn(2, 8).long()), "x must have dtype"),
    (lambda: rotary_embedding(torch.randn(3, 2, 8), torch.randn(3, 1, 8), torch.arange(2),
                              torch.ones(4, 4), torch.ones(4, 4)), r"positions must have shape \[3\]"),
    (lambda: rotary_embedding(torch.randn(3, 2, 8), torch.randn(3, 1, 8), torch.arange(3),
                              torch.ones(4, 3), torch.ones(4, 3)), r"cos_cache must have shape \[\*, 4\]"),
    (lambda: sgmv_shrink(torch.randn(4, 8), torch.randn(2, 4, 8), torch.ones(3),
                         torch.tensor([0, 4], dtype=I32), torch.tensor([0], dtype=I32)), r"scaling must have shape \[2\]"),
    (lambda: bgmv_expand(torch.randn(4, 8), torch.randn(4, 2), torch.randn(1, 6, 2),
                         torch.zeros(4, dtype=I32), 3), r"columns \[3, 9\) fall outside"),
    (lambda: fp8_linear(torch.randn(2, 8), torch.randn(4, 8), torch.ones(4)), "weight must have dtype"),
    (lambda: awq_gemm(torch.randn(2, 100), *awq_quantize(torch.randn(8, 128))), "multiple of group_size"),
    (lambda: awq_gemm(torch.randn(2, 128), *awq_quantize(torch.randn(8, 128)), group_size=96), "power of two"),
])
def test_launchers_reject(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        silu_and_mul(torch.randn(2, 8))


def test_use_triton_modes(monkeypatch) -> None:
    monkeypatch.delenv("TESSERA_KERNELS", raising=False)
    assert dispatch.use_triton("cpu") is False
    monkeypatch.setenv("TESSERA_KERNELS", "torch")
    assert dispatch.use_triton("cpu") is False
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    assert dispatch.use_triton("cpu") is True  # TRITON_INTERPRET=1 here
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="needs TRITON_INTERPRET=1"):
        dispatch.use_triton("cpu")
    monkeypatch.setenv("TESSERA_KERNELS", "cuda")
    with pytest.raises(ValueError, match="expected one of auto, triton, torch"):
        dispatch.use_triton("cpu")


def test_dispatch_routes_to_kernel_or_reference(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(R, "silu_and_mul_ref", lambda x: calls.append("ref") or x[:, :4])
    x = torch.randn(2, 8)
    monkeypatch.setenv("TESSERA_KERNELS", "torch")
    dispatch.silu_and_mul(x)
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    out = dispatch.silu_and_mul(x)
    assert calls == ["ref"]  # the second call ran the kernel
    torch.testing.assert_close(out, torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def test_dispatch_fp8_w8a8_request_falls_back_on_cpu(monkeypatch) -> None:
    monkeypatch.setenv("TESSERA_KERNELS", "torch")
    weight, scale = R.quantize_fp8_per_channel(torch.randn(16, 32))
    x = torch.randn(3, 32)
    got = dispatch.fp8_linear(x, weight, scale, quantize_activations=True)
    torch.testing.assert_close(got, R.fp8_linear_ref(x, weight, scale))


def _dispatch_cases() -> dict[str, tuple]:
    """One small call per dispatch wrapper: (function name, args, kwargs)."""
    kc, vc, tables = paged_cache(4, 16, 1, 16, torch.float32, [5, 9])
    lens = torch.tensor([5, 9], dtype=I32)
    seg = (torch.tensor([0, 2, 4], dtype=I32), torch.tensor([0, -1], dtype=I32))
    ids = torch.tensor([0, -1, 1, 0], dtype=I32)
    a, b, scaling = torch.randn(2, 4, 16), torch.randn(2, 24, 4), torch.ones(2)
    w_fp8, w_scale = R.quantize_fp8_per_channel(torch.randn(16, 32))
    return {
        "rms_norm": ((torch.randn(3, 16), torch.randn(16), 1e-5, torch.randn(3, 16)), {}),
        "rotary_embedding": ((torch.randn(3, 2, 8), torch.randn(3, 1, 8), torch.tensor([0, 4, 2]),
                              torch.rand(5, 4), torch.rand(5, 4)), {}),
        "silu_and_mul": ((torch.randn(3, 16),), {}),
        "paged_decode_attention": ((torch.randn(2, 2, 16), kc, vc, tables, lens, 0.25), {}),
        "prefill_attention": ((torch.randn(5, 2, 16), kc, vc, tables, torch.tensor([0, 2, 5], dtype=I32), lens,
                               0.25), {"max_seqlen_q": 3}),
        "sgmv_shrink": ((torch.randn(4, 16), a, scaling, *seg), {"max_seg_len": 2}),
        "sgmv_expand": ((torch.randn(4, 30), torch.randn(4, 4), b, *seg, 6), {}),
        "bgmv_shrink": ((torch.randn(4, 16), a, scaling, ids), {}),
        "bgmv_expand": ((torch.randn(4, 30), torch.randn(4, 4), b, ids, 3), {}),
        "fp8_linear": ((torch.randn(3, 32), w_fp8, w_scale), {}),
        "awq_gemm": ((torch.randn(3, 128), *awq_quantize(torch.randn(16, 128), 64), 64), {}),
    }


@pytest.mark.parametrize("name", list(_dispatch_cases()))
def test_every_dispatch_wrapper_gives_the_same_answer_both_ways(name, monkeypatch) -> None:
    args, kwargs = _dispatch_cases()[name]
    results = []
    for mode in ("torch", "triton"):
        monkeypatch.setenv("TESSERA_KERNELS", mode)
        cloned = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # expand works in place
        out = getattr(dispatch, name)(*cloned, **kwargs)
        results.append(out if isinstance(out, tuple) else (out,))
    for ref, kern in zip(*results, strict=True):
        torch.testing.assert_close(kern, ref, atol=1e-4, rtol=1e-4)
