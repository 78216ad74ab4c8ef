"""The engine on the Triton kernels (forced on the CPU, in the interpreter) equals the torch path.

The two paths lay the model out differently: the torch path interleaves q/k rows for its complex
rotary, the kernel path keeps Hugging Face's order for the rotate_half kernel. Same logits, same
greedy tokens, for dense and AWQ-packed weights, through decode, prefill and prefix-cache hits.
"""

from __future__ import annotations

import pytest
import torch

from dataplane import LLM, SamplingParams
from dataplane.models.attention import paged_attention, paged_attention_cpu, paged_attention_kernels
from dataplane.models.layers import NeoxRotary, Rotary, interleave_rotary_rows
from dataplane.models.loader import load_model
from dataplane.quantize.eval import prefill_logits
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors, write_awq_checkpoint

PROMPTS = [[5, 9, 14, 3, 22, 8, 40, 41, 2, 17, 33], [5, 9, 14, 3, 22, 8, 40, 41, 60], [70, 71]]
PARAMS = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=0)


def _both(monkeypatch, build):
    monkeypatch.setenv("TESSERA_KERNELS", "torch")
    torch_path = build()
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    kernel_path = build()
    return torch_path, kernel_path


def _generate(monkeypatch, mode, lm, **engine):
    monkeypatch.setenv("TESSERA_KERNELS", mode)
    # Block size 4 and a 6-token budget: chunked prefills after cached prefixes, mixed with decodes.
    llm = LLM("tiny", dtype="float32", preloaded=lm, block_size=4, max_num_batched_tokens=6, kv_cache_memory="1MiB",
              **engine)
    first = llm.generate(PROMPTS[:1], PARAMS)  # fills the prefix cache for the second prompt
    rest = llm.generate(PROMPTS, PARAMS)
    assert llm.core.stats().prefix_cache_hits > 0
    return first + rest


def _assert_same_generations(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        lx = [lp.logprob for lp in x.outputs[0].logprobs]
        ly = [lp.logprob for lp in y.outputs[0].logprobs]
        torch.testing.assert_close(torch.tensor(lx), torch.tensor(ly), atol=1e-4, rtol=0)


def test_layouts_differ_and_the_model_records_its_path(monkeypatch):
    args = tiny_args()
    tensors = tiny_tensors(args)
    cpu, kern = _both(monkeypatch, lambda: loaded(args, tensors))
    assert not cpu.model.use_kernels and kern.model.use_kernels
    assert isinstance(cpu.model.rotary, Rotary) and isinstance(kern.model.rotary, NeoxRotary)
    # The CPU path runs its decodes through the C++ op where it builds (kernels/cpu_decode.py).
    assert cpu.model._attention in (paged_attention, paged_attention_cpu)
    assert kern.model._attention is paged_attention_kernels
    q_rows = args.num_heads * args.head_dim
    w_cpu, w_kern = cpu.model.layers[0].qkv_proj.weight, kern.model.layers[0].qkv_proj.weight
    assert not torch.equal(w_cpu[:q_rows], w_kern[:q_rows])
    assert torch.equal(w_cpu[:q_rows], interleave_rotary_rows(w_kern[:q_rows], args.num_heads))


def _count_kernel_launches(monkeypatch) -> dict[str, int]:
    """Wrap each Triton launcher the forward should reach, counting its calls."""
    import importlib

    counts: dict[str, int] = {}
    for module, name in KERNELS:
        mod = importlib.import_module(f"kernels.{module}")
        original = getattr(mod, name)

        def wrapper(*a, _original=original, _name=name, **kw):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(*a, **kw)

        monkeypatch.setattr(mod, name, wrapper)
    return counts


KERNELS = [("rms_norm", "rms_norm"), ("rotary_kv", "rotary_write_kv"), ("silu_and_mul", "silu_and_mul"),
           ("paged_attention", "paged_decode_attention"), ("prefill_attention", "prefill_attention")]


def test_dense_logits_and_generations_match(monkeypatch):
    args = tiny_args()
    tensors = tiny_tensors(args, seed=1)
    cpu, kern = _both(monkeypatch, lambda: loaded(args, tensors))
    counts = _count_kernel_launches(monkeypatch)
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    kernel_logits = prefill_logits(kern.model, PROMPTS[0])
    monkeypatch.setenv("TESSERA_KERNELS", "torch")
    torch.testing.assert_close(kernel_logits, prefill_logits(cpu.model, PROMPTS[0]), atol=1e-4, rtol=1e-4)
    assert counts  # the prefill above ran on the kernels
    counts.clear()
    torch_runs = _generate(monkeypatch, "torch", cpu)
    assert not counts
    _assert_same_generations(torch_runs, _generate(monkeypatch, "triton", kern))
    assert set(counts) == {name for _, name in KERNELS}, counts


def test_residual_adds_ride_in_the_rms_norm_kernel(monkeypatch):
    """On the kernel path every residual add but the last goes into an RMSNorm launch (2 per layer, less the
    first layer's input norm, which has nothing to add); the logits are the torch path's."""
    import kernels.rms_norm as rms_norm_kernel

    args = tiny_args()
    cpu, kern = _both(monkeypatch, lambda: loaded(args, tiny_tensors(args, seed=4)))
    with_residual = []
    original = rms_norm_kernel.rms_norm

    def counting(x, weight, eps=1e-6, residual=None):
        with_residual.append(residual is not None)
        return original(x, weight, eps, residual)

    monkeypatch.setattr(rms_norm_kernel, "rms_norm", counting)
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    kernel_logits = prefill_logits(kern.model, PROMPTS[0])
    assert sum(with_residual) == 2 * args.num_layers - 1
    assert len(with_residual) == 2 * args.num_layers + 1  # and the final norm
    monkeypatch.setenv("TESSERA_KERNELS", "torch")
    torch.testing.assert_close(kernel_logits, prefill_logits(cpu.model, PROMPTS[0]), atol=1e-4, rtol=1e-4)


def test_fp8_kv_cache_on_both_paths(monkeypatch):
    """The kernel path quantizes K/V as it writes them (kernels/rotary_kv.py), the torch path with
    kv_fp8.quantize before its copy: the same bytes, so the same generations."""
    args = tiny_args()
    cpu, kern = _both(monkeypatch, lambda: loaded(args, tiny_tensors(args, seed=3)))
    counts = _count_kernel_launches(monkeypatch)
    torch_runs = _generate(monkeypatch, "torch", cpu, kv_cache_dtype="fp8")
    kernel_runs = _generate(monkeypatch, "triton", kern, kv_cache_dtype="fp8")
    assert counts.get("rotary_write_kv")
    _assert_same_generations(torch_runs, kernel_runs)


def test_awq_checkpoint_on_both_paths(monkeypatch, tmp_path):
    args = tiny_args(tied=True)
    write_awq_checkpoint(tmp_path / "awq", args, tiny_tensors(args, seed=2), group_size=32)
    cpu, kern = _both(monkeypatch, lambda: load_model(str(tmp_path / "awq"), torch.float32, progress=False))
    _assert_same_generations(_generate(monkeypatch, "torch", cpu), _generate(monkeypatch, "triton", kern))


def test_forcing_triton_on_the_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    args = tiny_args()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        loaded(args, tiny_tensors(args))
