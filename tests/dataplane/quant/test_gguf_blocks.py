"""quantization="gguf": SmolLM2's own Q4_1 / Q8_0 blocks kept as they are and run by the C++ kernels."""

from __future__ import annotations

import pytest
import torch

from dataplane import LLM, SamplingParams
from dataplane.config import ModelConfig
from dataplane.models.loader import load_model
from dataplane.quant.gguf import GgufLinear
from dataplane.quantize.gate import quality_gate
from kernels import cpu_ext

from ..conftest import MODEL, PROMPTS


@pytest.fixture(scope="module")
def smollm_gguf():
    return load_model(MODEL, torch.float32, progress=False, quantization="gguf")


def test_every_projection_and_the_head_keep_the_files_blocks_and_values(smollm_gguf, smollm_fp32):
    g, d = smollm_gguf.model, smollm_fp32.model
    for layer_g, layer_d in zip(g.layers, d.layers, strict=True):
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            proj = getattr(layer_g, name)
            assert isinstance(proj, GgufLinear) and proj.fmt == "Q4_1"
            # the dense model is these very values (q/k rows permuted alike for the rotary)
            assert torch.equal(proj.dense_weight(), getattr(layer_d, name).weight.float())
    assert isinstance(g.lm_head, GgufLinear) and g.lm_head.fmt == "Q8_0"
    assert torch.equal(g.lm_head.dense_weight(), d.embed.float())
    # 4.5 bits a weight for the projections, 8.5 for the head, against float32's 32 (the dense
    # embedding for lookups stays in both)
    assert g.weight_bytes < 0.45 * d.weight_bytes


def test_greedy_text_stays_with_the_float_model(smollm_gguf, smollm_fp32):
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outs_g = LLM(MODEL, dtype="float32", preloaded=smollm_gguf).generate(PROMPTS, params)
    outs_d = LLM(MODEL, dtype="float32", preloaded=smollm_fp32).generate(PROMPTS, params)
    same_prefix = []
    for og, od in zip(outs_g, outs_d, strict=True):
        a, b = og.outputs[0].token_ids, od.outputs[0].token_ids
        assert len(a) == 24
        same_prefix.append(next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a)))
    # 8-bit activations move logits slightly, and free-running greedy text follows the first flipped
    # near-tie (the quality gate's teacher-forced agreement is the measure: 95%); every first token
    # agrees and a good share of the text
    assert min(same_prefix) >= 1 and sum(same_prefix) >= 0.3 * 24 * len(PROMPTS), same_prefix


@pytest.mark.slow
def test_it_passes_the_quality_gate(smollm_gguf, smollm_fp32):
    report = quality_gate(MODEL, MODEL, "gguf", dtype="float32", baseline_model=smollm_fp32,
                          candidate_model=smollm_gguf)
    assert report.passed, report.reason
    assert report.perplexity_increase < 0.01 and report.greedy_agreement >= 0.9


def test_a_dense_copy_answers_above_the_threshold():
    loaded = load_model(MODEL, torch.float32, progress=False, quantization="gguf", int4_dense_above=4)
    proj = loaded.model.layers[0].gate_up_proj
    x_small, x_big = torch.randn(2, 576), torch.randn(6, 576)
    dense = proj.dense_weight()
    # the dense copy gives the float product up to summation order (its GEMM may be a prepacked one);
    # the kernel (8-bit activations) only close to it, two orders of magnitude further off
    torch.testing.assert_close(proj(x_big), x_big @ dense.t(), rtol=1e-4, atol=1e-4)
    assert not torch.equal(proj(x_small), x_small @ dense.t())
    expected = x_small @ dense.t()
    assert float((proj(x_small) - expected).abs().max()) < 0.03 * float(expected.abs().max())


def test_gguf_needs_a_gguf_file_on_the_cpu(tmp_path):
    with pytest.raises(ValueError, match="directory"):
        load_model(str(tmp_path), torch.float32, progress=False, quantization="gguf")
    with pytest.raises(ValueError, match="CPU only"):
        load_model(MODEL, torch.float32, device="meta", progress=False, quantization="gguf")
    with pytest.raises(ValueError, match="not supported"):
        ModelConfig(MODEL, quantization="gguf4")


def test_without_the_kernels_the_blocks_load_dense(monkeypatch):
    """No compiler on the host: the model still loads and computes, with dense weights."""
    monkeypatch.setenv("TESSERA_CPU_KERNELS", "0")
    cpu_ext.extension.cache_clear()
    try:
        loaded = load_model(MODEL, torch.float32, progress=False, quantization="gguf")
        assert not any(isinstance(p, GgufLinear) for p in (loaded.model.layers[0].qkv_proj, loaded.model.lm_head))
    finally:
        monkeypatch.delenv("TESSERA_CPU_KERNELS")
        cpu_ext.extension.cache_clear()
    assert cpu_ext.extension() is not None


def test_the_fused_decode_step_is_as_near_the_float_model_as_the_per_op_path(smollm_gguf, smollm_fp32):
    # Decode-only steps run as one C++ call (models/fused_decode.py); the per-op path is its twin.
    # Both round activations to 8 bits, so an ulp apart (SiLU's exponential is a polynomial there,
    # torch's Sleef here) can flip a rounding and the two part by the scheme's own noise, not
    # more: at every decode step of a batched run (rows of several decode groups), on the same
    # cache, each is compared with the float32 model, and they pick the same next token.
    model, dense = smollm_gguf.model, smollm_fp32.model
    fused = model.fused
    assert fused is not None
    step = model.hidden_states
    seen = {"steps": 0, "rows": 0, "agree": 0, "err_fused": 0.0, "err_ops": 0.0}

    def compare(ids, pos, meta, kv, lora=None):
        if not fused.applies(ids.shape[0], meta, lora):
            return step(ids, pos, meta, kv, lora)
        saved = [(k.clone(), v.clone()) for k, v in kv]

        def run(fn):
            out = fn(ids, pos, meta, kv)
            for (k, v), (sk, sv) in zip(kv, saved, strict=True):
                k.copy_(sk)
                v.copy_(sv)
            return out
        h_fused = run(fused)
        model.fused = None
        try:
            h_ops = run(step)
        finally:
            model.fused = fused
        h_dense = run(dense.hidden_states)
        rows = torch.arange(ids.shape[0])
        seen["steps"] += 1
        seen["rows"] += ids.shape[0]
        seen["agree"] += int((model.logits(h_fused, rows).argmax(-1) == model.logits(h_ops, rows).argmax(-1)).sum())
        seen["err_fused"] += float((h_fused - h_dense).norm() / h_dense.norm())
        seen["err_ops"] += float((h_ops - h_dense).norm() / h_dense.norm())
        return step(ids, pos, meta, kv, lora)

    model.hidden_states = compare
    try:
        LLM(MODEL, dtype="float32", preloaded=smollm_gguf).generate(
            PROMPTS, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    finally:
        del model.hidden_states
    assert seen["steps"] >= 15 and seen["rows"] >= 15 * len(PROMPTS)
    assert seen["agree"] >= 0.95 * seen["rows"], seen
    assert seen["err_fused"] <= 1.25 * seen["err_ops"] and seen["err_fused"] / seen["steps"] < 0.05, seen
