"""AWQ's pieces on small tensors: group rounding, scale search, grid search, GPTQ, the whole pass on a tiny model."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dataplane.quantize.awq import (
    AwqOptions,
    awq_quantize_model,
    fake_quantize,
    gptq_round,
    pack_awq,
    round_groups,
    search_grid,
    search_scales,
)
from dataplane.quantize.eval import prefill_logits
from kernels.awq_layout import awq_dequantize, awq_quantize
from tests.dataplane.quant.tiny import PROJ, loaded, tiny_args, tiny_tensors

G = 32


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _inputs(t: int, k: int, seed: int = 0) -> torch.Tensor:
    """Activations with a few large channels and a non-zero mean, as LLM activations have."""
    x = torch.randn(t, k, generator=_gen(seed)) + 0.3
    x[:, :3] *= 20
    return x


def test_round_groups_then_pack_is_awq_quantize():
    w = torch.randn(64, 128, generator=_gen(1))
    for got, want in zip(pack_awq(*round_groups(w, G)), awq_quantize(w, G), strict=True):
        assert torch.equal(got, want)


def test_scale_search_protects_the_salient_channels():
    w = torch.randn(96, 128, generator=_gen(2)) / 128**0.5
    x = _inputs(256, 128)
    ref = F.linear(x, w)

    def block(ws):
        return F.linear(x, ws[0].float())

    s = search_scales(x, [w], block, AwqOptions(group_size=G, n_grid=10))
    assert int(s.argmax()) < 3  # a large activation channel gets the largest scale
    awq = fake_quantize(w * s, G) / s
    assert (F.linear(x, awq) - ref).pow(2).mean() < 0.8 * (F.linear(x, fake_quantize(w, G)) - ref).pow(2).mean()


def test_grid_search_never_loses_to_min_max_on_its_objective():
    w = torch.randn(64, 128, generator=_gen(3))
    x = _inputs(200, 128, seed=4)
    params = search_grid(w, x, AwqOptions(group_size=G))
    err_search = (F.linear(x, fake_quantize(w, G, params) - w)).pow(2).mean()
    err_minmax = (F.linear(x, fake_quantize(w, G) - w)).pow(2).mean()
    assert err_search < 0.9 * err_minmax


def test_gptq_lowers_the_output_error():
    w = torch.randn(64, 256, generator=_gen(5))
    x = _inputs(512, 256, seed=6)
    for params in (None, search_grid(w, x, AwqOptions(group_size=G))):
        q, scales, zeros = gptq_round(w, x, G, params, act_order=params is not None)
        dq = ((q.view(64, -1, G) - zeros[..., None]) * scales[..., None]).view(64, 256)
        assert q.min() >= 0 and q.max() <= 15
        gptq_err = F.linear(x, dq - w).pow(2).mean()
        assert gptq_err < 0.8 * F.linear(x, fake_quantize(w, G, params) - w).pow(2).mean()


def test_whole_pass_on_a_tiny_model_folds_scales_and_stays_close():
    args = tiny_args(tied=True)
    t = tiny_tensors(args, seed=7)
    t["model.embed_tokens.weight"][:, :3] *= 10  # salient residual channels, which AWQ scales up
    calib = torch.randint(0, args.vocab_size, (4, 32), generator=_gen(8))
    out = awq_quantize_model(args, t, calib, AwqOptions(group_size=G, n_grid=5), progress=False)
    p = "model.layers.1."
    assert out[p + "self_attn.q_proj.qweight"].shape == (64, 64 // 8)
    assert out[p + "mlp.down_proj.scales"].shape == (128 // G, 64) and "lm_head.weight" not in out
    folded = [n for n in out if "norm.weight" in n and n != "model.norm.weight"
              and not torch.equal(out[n], t[n].half())]
    assert folded  # scales were folded into RMSNorm weights
    dense = {k: v.float() for k, v in out.items() if k.endswith("weight")}
    for i in range(args.num_layers):
        for proj in PROJ:
            q = f"model.layers.{i}.{proj}"
            dense[q + ".weight"] = awq_dequantize(out[q + ".qweight"], out[q + ".qzeros"], out[q + ".scales"], G).t()
    ids = calib[0].tolist()
    want = prefill_logits(loaded(args, t).model, ids)
    error = float((prefill_logits(loaded(args, dense).model, ids) - want).norm() / want.norm())
    assert error < 0.2
