"""Quantized checkpoints and quantization at load, on a tiny random Llama (no real weights needed)."""

from __future__ import annotations

import json

import pytest
import torch

from dataplane.config import ModelConfig
from dataplane.models.layers import Linear
from dataplane.models.loader import load_model
from dataplane.quant import Fp8Linear, Int4Linear, Int8Linear
from dataplane.quant.checkpoint import QuantSpec, resolve_quantization
from dataplane.quantize.eval import prefill_logits
from dataplane.quantize.export import FP8_CONFIG, fp8_tensors, hf_config, write_checkpoint
from kernels.reference import quantize_fp8_per_channel
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors, tiny_tokenizer, write_awq_checkpoint

PROMPT = [3, 17, 42, 8, 91, 5, 23, 60, 11, 2, 77, 30, 45, 19, 64, 7, 88, 12]


def _close_logits(actual: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, atol=rel * scale, rtol=0)


@pytest.fixture(scope="module")
def float_model():
    args = tiny_args()
    return args, tiny_tensors(args)


def test_autoawq_checkpoint_loads_and_matches_its_dequantized_dense_model(tmp_path, float_model):
    args, tensors = float_model
    dense = write_awq_checkpoint(tmp_path / "awq", args, tensors, group_size=32)
    q = load_model(str(tmp_path / "awq"), torch.float32, progress=False)
    layer = q.model.layers[0]
    assert isinstance(layer.qkv_proj, Int4Linear) and isinstance(layer.down_proj, Int4Linear)
    assert isinstance(q.model.lm_head, Linear)  # the head stays dense by default
    want = prefill_logits(loaded(args, dense).model, PROMPT)
    _close_logits(prefill_logits(q.model, PROMPT), want, 1e-4)
    # The packed columns were permuted like the dense rows: the fused layers agree row for row.
    ref = loaded(args, dense).model.layers[0]
    torch.testing.assert_close(layer.qkv_proj.dense_weight(), ref.qkv_proj.weight, atol=1e-5, rtol=0)


def test_awq_checkpoint_with_modules_not_converted(tmp_path, float_model):
    args, tensors = float_model
    dense = write_awq_checkpoint(tmp_path / "awq", args, tensors, group_size=32, keep_dense=("q_proj", "k_proj"))
    assert json.loads((tmp_path / "awq" / "config.json").read_text())["quantization_config"][
        "modules_to_not_convert"] == ["q_proj", "k_proj"]
    q = load_model(str(tmp_path / "awq"), torch.float32, progress=False)
    layer = q.model.layers[1]
    assert isinstance(layer.qkv_proj, Linear)  # v is dequantized into the fused dense q/k/v
    assert isinstance(layer.o_proj, Int4Linear) and isinstance(layer.gate_up_proj, Int4Linear)
    _close_logits(prefill_logits(q.model, PROMPT), prefill_logits(loaded(args, dense).model, PROMPT), 1e-4)


def test_awq_checkpoint_generates_through_the_engine(tmp_path, float_model):
    from dataplane import LLM, SamplingParams

    args, tensors = float_model
    write_awq_checkpoint(tmp_path / "awq", args, tensors, group_size=32)
    llm = LLM(str(tmp_path / "awq"), dtype="bfloat16", block_size=4, kv_cache_memory="4MiB")
    out = llm.generate([PROMPT, PROMPT[:5]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert [len(o.token_ids) for o in out] == [6, 6]
    assert llm.core.memory.weight_bytes < loaded(args, tensors, torch.bfloat16).model.weight_bytes


def test_fp8_checkpoint_round_trip(tmp_path, float_model):
    args, tensors = float_model
    fp8 = fp8_tensors(args, tensors)
    write_checkpoint(tmp_path / "fp8", {**hf_config(args, tmp_path, "bfloat16"), "quantization_config": FP8_CONFIG},
                     fp8, tiny_tokenizer())
    cfg = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "fp8"
    q = load_model(str(tmp_path / "fp8"), torch.float32, progress=False)
    # On the CPU the e4m3 weight is decoded once at load and served as a plain Linear.
    assert isinstance(q.model.layers[1].gate_up_proj, Linear)
    dense = {k: (v.float() * fp8[k.removesuffix(".weight") + ".weight_scale"][:, None]
                 if v.dtype == torch.float8_e4m3fn else v.float()) for k, v in fp8.items() if "weight_scale" not in k}
    _close_logits(prefill_logits(q.model, PROMPT), prefill_logits(loaded(args, dense).model, PROMPT), 1e-4)


@pytest.mark.parametrize("method,cls", [("int4", Int4Linear), ("int8", Int8Linear), ("fp8", Linear)])
def test_quantization_at_load_stays_close_to_dense(float_model, method, cls):
    args, tensors = float_model
    spec = resolve_quantization(method, None)
    q = loaded(args, tensors, quant=QuantSpec(spec.method, False, 32 if method == "int4" else None))
    assert isinstance(q.model.layers[0].o_proj, cls) and isinstance(q.model.lm_head, Linear)
    want = prefill_logits(loaded(args, tensors).model, PROMPT)
    error = float((prefill_logits(q.model, PROMPT) - want).norm() / want.norm())
    assert error < {"int4": 0.2, "int8": 0.03, "fp8": 0.08}[method]  # loose sanity bounds


def test_quantize_lm_head_is_opt_in(float_model):
    args, tensors = float_model
    q = loaded(args, tensors, quant=QuantSpec("int8", False, quantize_lm_head=True))
    assert isinstance(q.model.lm_head, Int8Linear)
    q = loaded(args, tensors, quant=QuantSpec("int4", False, 32, quantize_lm_head=True))
    assert isinstance(q.model.lm_head, Int8Linear)  # 4-bit methods give the head int8
    assert isinstance(q.model.layers[0].o_proj, Int4Linear)


def test_fp8_layer_keeps_e4m3_when_not_decoded():
    w8, scale = quantize_fp8_per_channel(torch.randn(32, 64))
    layer = Fp8Linear(w8, scale, cpu_mode="per_call")
    assert layer.weight is not None and layer.weight.dtype == torch.float8_e4m3fn


def test_int4_dense_copy_for_large_batches():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g)
    packed, both = Int4Linear.from_float(w, 32), Int4Linear.from_float(w, 32, dense_above=4)
    assert both.weight_bytes == packed.weight_bytes + 64 * 128 * 2
    for rows in (1, 4, 5, 16):
        x = torch.randn(rows, 128, generator=g).bfloat16()
        got, want = both(x).float(), packed(x).float()
        # Relative to the output's scale: outputs are ~10 here, where one bf16 ulp is 0.06, and the two
        # paths round their fp32 sums differently (by one ulp on an AVX2 host's emulated bf16 GEMM).
        assert float((got - want).norm() / want.norm()) < 1e-2
        assert float((got - want).abs().max()) <= 2 * 2.0 ** -8 * float(want.abs().max())


def test_method_validation(tmp_path, float_model):
    args, tensors = float_model
    with pytest.raises(ValueError, match="quantization"):
        ModelConfig(model="x", quantization="int3")
    with pytest.raises(ValueError, match="calibrated AWQ checkpoint"):
        resolve_quantization("awq", None)
    write_awq_checkpoint(tmp_path / "awq", args, tensors, group_size=32)
    with pytest.raises(ValueError, match="holds 'awq'"):
        load_model(str(tmp_path / "awq"), torch.float32, progress=False, quantization="fp8")
    cfg = json.loads((tmp_path / "awq" / "config.json").read_text())
    cfg["quantization_config"]["version"] = "gemv"
    (tmp_path / "awq" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="gemv"):
        load_model(str(tmp_path / "awq"), torch.float32, progress=False)
