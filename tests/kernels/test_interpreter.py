"""The harness itself: kernels really run interpreted, and the interpreter shims hold."""

from __future__ import annotations

import importlib

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

KERNEL_MODULES = ["rms_norm", "rotary", "silu_and_mul", "paged_attention", "prefill_attention",
                  "lora_shrink", "lora_expand", "fp8_gemm", "awq_gemm"]


@pytest.mark.parametrize("name", KERNEL_MODULES)
def test_kernels_are_interpreted(name: str) -> None:
    module = importlib.import_module(f"kernels.{name}")
    kernels = [v for k, v in vars(module).items() if k.startswith("_") and k.endswith("_kernel")]
    assert kernels and all(isinstance(k, InterpretedFunction) for k in kernels)
    assert isinstance(tl.sum, InterpretedFunction)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    a = tl.load(a_ptr + r[:, None] * N + r[None, :])
    b = tl.load(b_ptr + r[:, None] * N + r[None, :])
    tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))


@triton.jit
def _cast_kernel(x_ptr, y_ptr, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(y_ptr + r, tl.load(x_ptr + r).to(tl.bfloat16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dot_of_half_types_is_exact_products_summed_in_float32(dtype: torch.dtype) -> None:
    a = torch.randint(-3, 4, (16, 16)).to(dtype)
    b = torch.randint(-3, 4, (16, 16)).to(dtype)
    c = torch.empty(16, 16)
    _dot_kernel[(1,)](a, b, c, 16)
    torch.testing.assert_close(c, a.float() @ b.float(), atol=0, rtol=0)


def test_float32_to_bfloat16_rounds_to_nearest_even() -> None:
    x = torch.randn(4096)
    x[:4] = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, float("inf"), float("nan")])  # ties, inf, nan
    y = torch.empty(4096, dtype=torch.bfloat16)
    _cast_kernel[(1,)](x, y, 4096)
    expected = x.to(torch.bfloat16)
    assert torch.equal(y[:3], expected[:3]) and y[3].isnan()
    assert torch.equal(y[4:], expected[4:])
