"""LoRA without a model: adapter parsing and refusals, slot layout and eviction, the per-step batched delta."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dataplane.config import LORA_TARGET_MODULES, LoRAConfig
from dataplane.lora.adapter import GROUPS, load_adapter
from dataplane.lora.context import build_context
from dataplane.lora.registry import AdapterRegistry
from dataplane.lora.slots import LoRASlots
from tests.dataplane.lora_helpers import TINY, lora_scaling, reference_delta, write_adapter

ALL = LORA_TARGET_MODULES


def _load(path, name="t", max_rank=16, dtype=torch.float32, interleave_qk=True):
    return load_adapter(name, path, TINY, max_rank=max_rank, dtype=dtype, interleave_qk=interleave_qk)


# -- config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [({"max_loras": 0}, "max_loras"), ({"max_lora_rank": 65}, "max_lora_rank"),
                                           ({"max_lora_rank": 0}, "max_lora_rank"),
                                           ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras")])
def test_config_refuses_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        LoRAConfig(**kwargs)


def test_config_defaults_host_bound():
    assert LoRAConfig(max_loras=3).max_cpu_loras == 48


# -- parsing -----------------------------------------------------------------------------------------
def test_parse_folds_scaling_and_interleaves_qk(tmp_path):
    tensors = write_adapter(tmp_path, TINY, 4, ("q_proj", "k_proj", "v_proj", "down_proj"), alpha=6, seed=1)
    a = _load(tmp_path)
    assert a.rank == 4 and a.target_modules == ("q_proj", "k_proj", "v_proj", "down_proj")
    assert a.groups == {"qkv", "down"} and a.scaling["q_proj"] == pytest.approx(1.5)
    subs = {s.sub: s for s in a.layers[1]["qkv"]}
    b_q = tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"]
    b_v = tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"]
    assert torch.allclose(subs[2].b, b_v * 1.5)
    assert not torch.allclose(subs[0].b, b_q * 1.5)  # rows permuted like the base q rows
    plain = {s.sub: s for s in _load(tmp_path, interleave_qk=False).layers[1]["qkv"]}
    assert torch.allclose(plain[0].b, b_q * 1.5)


def test_parse_rslora_scaling(tmp_path):
    write_adapter(tmp_path, TINY, 4, ("v_proj",), alpha=8, rslora=True)
    assert _load(tmp_path).scaling["v_proj"] == pytest.approx(8 / 2)


def test_parse_alpha_pattern(tmp_path):
    write_adapter(tmp_path, TINY, 4, ("v_proj", "o_proj"), alpha=8, config={"alpha_pattern": {"o_proj": 2}})
    a = _load(tmp_path)
    assert a.scaling == {"v_proj": 2.0, "o_proj": 0.5}


def _bad(tmp_path, **kw):
    write_adapter(tmp_path, TINY, 4, kw.pop("targets", ("q_proj",)), **kw)
    return tmp_path


@pytest.mark.parametrize("case, message", [
    ("missing_dir", "is not a directory"),
    ("missing_config", "adapter_config.json is missing"),
    ("missing_weights", "adapter_model.safetensors is missing"),
    ("bin_only", "adapter_model.bin is not read"),
    ("bad_json", "not valid JSON"),
    ("rank_too_large", "rank 32 .* exceeds max_lora_rank=16"),
    ("wrong_shape", "lora_A \\[4, 40\\].*the base model needs \\[r, 32\\]"),
    ("lm_head_tensor", "unsupported module"),
    ("embedding_tensor", "unsupported module"),
    ("config_target", "target module\\(s\\) lm_head are not supported"),
    ("dora", "DoRA"),
    ("modules_to_save", "modules_to_save"),
    ("bias", "bias"),
    ("half_pair", "not both lora_A and lora_B"),
    ("layer_out_of_range", "names layer 7"),
    ("not_safetensors", "cannot read adapter_model.safetensors"),
    ("empty", "holds no LoRA weights"),
    ("bad_name", "name must be"),
])
def test_bad_adapters_are_refused(tmp_path, case, message):
    d = tmp_path / "a"
    name = "t"
    if case == "missing_dir":
        pass
    elif case == "missing_config":
        _bad(d)
        (d / "adapter_config.json").unlink()
    elif case in ("missing_weights", "bin_only"):
        _bad(d)
        (d / "adapter_model.safetensors").unlink()
        if case == "bin_only":
            (d / "adapter_model.bin").write_bytes(b"\0")
    elif case == "bad_json":
        _bad(d)
        (d / "adapter_config.json").write_text("{nope")
    elif case == "rank_too_large":
        write_adapter(d, TINY, 32, ("q_proj",))
    elif case == "wrong_shape":
        write_adapter(d, TINY, 4, ("q_proj",), tensors={
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 40),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.ones(32, 4)})
    elif case == "lm_head_tensor":
        write_adapter(d, TINY, 4, ("q_proj",), tensors={"base_model.model.lm_head.lora_A.weight": torch.ones(4, 32),
                                                         "base_model.model.lm_head.lora_B.weight": torch.ones(64, 4)})
    elif case == "embedding_tensor":
        write_adapter(d, TINY, 4, ("q_proj",), tensors={
            "base_model.model.model.embed_tokens.lora_embedding_A": torch.ones(4, 64)})
    elif case == "config_target":
        _bad(d, config={"target_modules": ["q_proj", "lm_head"]})
    elif case == "dora":
        _bad(d, config={"use_dora": True})
    elif case == "modules_to_save":
        _bad(d, config={"modules_to_save": ["lm_head"]})
    elif case == "bias":
        _bad(d, config={"bias": "all"})
    elif case == "half_pair":
        write_adapter(d, TINY, 4, ("q_proj",), tensors={
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 32)})
    elif case == "layer_out_of_range":
        write_adapter(d, TINY, 4, ("q_proj",), tensors={
            "base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight": torch.ones(4, 32),
            "base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight": torch.ones(32, 4)})
    elif case == "not_safetensors":
        _bad(d)
        (d / "adapter_model.safetensors").write_bytes(b"garbage")
    elif case == "empty":
        d.mkdir()
        save_file({}, str(d / "adapter_model.safetensors"))
        (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    elif case == "bad_name":
        _bad(d)
        name = "has#hash"
    with pytest.raises(ValueError, match=message) as err:
        _load(d, name=name)
    if case != "bad_name":
        assert str(err.value).startswith("adapter 't':")


# -- registry ----------------------------------------------------------------------------------------
def test_registry_drops_least_recently_used_idle_adapter(tmp_path):
    reg = AdapterRegistry(max_cpu_loras=2)
    ads = []
    for i in range(3):
        write_adapter(tmp_path / str(i), TINY, 2, ("v_proj",), seed=i)
        ads.append(_load(tmp_path / str(i), name=f"a{i}"))
    reg.add(ads[0], lambda k: False)
    reg.add(ads[1], lambda k: False)
    reg.touch(ads[0].key)  # a0 is now more recent than a1
    dropped = reg.add(ads[2], lambda k: False)
    assert [a.name for a in dropped] == ["a1"] and reg.names() == ["a0", "a2"]
    busy = {ads[0].key, ads[2].key}
    with pytest.raises(ValueError, match="all are in use"):
        reg.add(_load(tmp_path / "1", name="a3"), lambda k: k in busy)
    with pytest.raises(ValueError, match="in use"):
        reg.remove("a0", lambda k: k in busy)
    with pytest.raises(ValueError, match="^adapter: unknown adapter 'nope'"):
        reg.resolve("nope")


def test_registry_same_name_same_path_is_a_no_op(tmp_path):
    write_adapter(tmp_path / "x", TINY, 2, ("v_proj",))
    write_adapter(tmp_path / "y", TINY, 2, ("v_proj",))
    reg = AdapterRegistry(4)
    first = _load(tmp_path / "x", name="a")
    reg.add(first, lambda k: False)
    reg.add(_load(tmp_path / "x", name="a"), lambda k: False)
    assert reg.get("a") is first
    with pytest.raises(ValueError, match="already loaded from"):
        reg.add(_load(tmp_path / "y", name="a"), lambda k: False)


# -- slots and the batched delta ---------------------------------------------------------------------
def _adapters(tmp_path, specs, dtype=torch.float32, interleave_qk=True):
    out = []
    for i, (rank, targets, alpha, rslora) in enumerate(specs):
        tensors = write_adapter(tmp_path / f"a{i}", TINY, rank, targets, alpha=alpha, rslora=rslora, seed=10 + i)
        out.append((load_adapter(f"a{i}", tmp_path / f"a{i}", TINY, max_rank=8, dtype=dtype,
                                 interleave_qk=interleave_qk), tensors, lora_scaling(alpha, rank, rslora)))
    return out


SPECS = [(4, ALL, 8, False), (2, ("q_proj", "v_proj"), 4, True), (8, ("k_proj", "o_proj", "up_proj", "down_proj"), 3,
                                                                     False)]


def _check_step(slots, adapters, rows, num_decodes, use_kernels, interleave_qk=True, dtype=torch.float32, atol=1e-4):
    """rows: (adapter index or None, tokens) per request; compares every group's delta with the reference."""
    active = sorted({i for i, _ in rows if i is not None})
    slot_of = slots.assign([adapters[i][0] for i in active])
    ctx = build_context(slots, [(None if i is None else slot_of[adapters[i][0].key], n) for i, n in rows],
                        num_decodes, max(adapters[i][0].rank for i in active),
                        frozenset().union(*(adapters[i][0].groups for i in active)), use_kernels)
    t = sum(n for _, n in rows)
    gen = torch.Generator().manual_seed(t)
    for layer in range(TINY.num_layers):
        for group, shape in slots.shapes.items():
            x = torch.randn(t, shape.in_features, generator=gen).to(dtype)
            y = torch.zeros(t, shape.out_total, dtype=dtype)
            ctx.apply(layer, group, x, y)
            want = torch.zeros(t, shape.out_total, dtype=torch.float64)
            start = 0
            for i, n in rows:
                if i is not None:
                    _, tensors, s = adapters[i]
                    want[start : start + n] = reference_delta(tensors, TINY, layer, group, x[start : start + n],
                                                              s, interleave_qk)
                start += n
            torch.testing.assert_close(y.double(), want, atol=atol, rtol=1e-3)
    return ctx


@pytest.mark.parametrize("rows, num_decodes, mode", [
    ([(0, 1), (1, 1), (None, 1), (0, 1), (2, 1)], 5, "range"),  # decodes of three adapters and the base model
    ([(0, 1), (0, 1), (1, 1), (1, 1)], 4, "range"),  # no base token: pads are never read
    ([(1, 1), (None, 1), (0, 9), (None, 5), (2, 3), (1, 4)], 2, "range"),  # decodes and prefill chunks
    ([(0, 40), (1, 1), (2, 1)], 0, "split"),  # one long chunk beside two short ones: groups are split
    ([(None, 3), (2, 1)], 1, "range"),
])
def test_gathered_delta_matches_reference(tmp_path, rows, num_decodes, mode):
    adapters = _adapters(tmp_path, SPECS)
    slots = LoRASlots(TINY, 4, 8, torch.float32, torch.device("cpu"), kernel_layout=False)
    ctx = _check_step(slots, adapters, rows, num_decodes, use_kernels=False)
    assert (ctx.slot_range is not None) == (mode == "range")


def test_slots_evict_least_recently_used_and_reload_identically(tmp_path):
    adapters = _adapters(tmp_path, SPECS)
    slots = LoRASlots(TINY, 2, 8, torch.float32, torch.device("cpu"), kernel_layout=False)
    _check_step(slots, adapters, [(0, 2), (1, 1)], 0, use_kernels=False)
    assert slots.keys == [adapters[0][0].key, adapters[1][0].key]
    _check_step(slots, adapters, [(1, 1)], 1, use_kernels=False)  # a1 is now the most recent
    _check_step(slots, adapters, [(2, 3), (1, 1)], 0, use_kernels=False)  # evicts a0, not a1
    assert slots.keys == [adapters[2][0].key, adapters[1][0].key] and slots.num_evictions == 1
    # a0 comes back into the slot a2 (rank 8, more targets) used: leftovers must be cleared.
    _check_step(slots, adapters, [(0, 2), (None, 1)], 0, use_kernels=False)
    assert slots.num_loads == 4
    with pytest.raises(RuntimeError, match="max_loras=2"):
        slots.assign([a for a, _, _ in adapters])


def test_buffers_only_for_targeted_projections(tmp_path):
    adapters = _adapters(tmp_path, [(2, ("q_proj", "v_proj"), 4, False)])
    slots = LoRASlots(TINY, 2, 8, torch.float32, torch.device("cpu"), kernel_layout=False)
    slots.assign([adapters[0][0]])
    assert set(slots.a) == {"qkv"}


def test_random_batches_match_reference(tmp_path):
    adapters = _adapters(tmp_path, SPECS)
    slots = LoRASlots(TINY, 3, 8, torch.float32, torch.device("cpu"), kernel_layout=False)
    rng = random.Random(0)
    for _ in range(8):
        nd = rng.randint(0, 6)
        rows = [(rng.choice([0, 1, 2, None]), 1) for _ in range(nd)]
        rows += [(rng.choice([0, 1, 2, None]), rng.randint(2, 20)) for _ in range(rng.randint(0, 3))]
        if all(i is None for i, _ in rows):
            rows.append((0, 1))
        _check_step(slots, adapters, rows, nd, use_kernels=False)


@pytest.mark.parametrize("interleave_qk", [True, False])
def test_kernel_path_with_torch_references(tmp_path, monkeypatch, interleave_qk):
    """The CUDA path's code (BGMV for decodes, SGMV for prefill chunks) through kernels.dispatch's torch twins."""
    monkeypatch.setenv("TESSERA_KERNELS", "torch")
    adapters = _adapters(tmp_path, SPECS, interleave_qk=interleave_qk)
    slots = LoRASlots(TINY, 4, 8, torch.float32, torch.device("cpu"), kernel_layout=True)
    _check_step(slots, adapters, [(1, 1), (None, 1), (0, 1), (0, 9), (0, 3), (None, 5), (2, 3)], 3,
                use_kernels=True, interleave_qk=interleave_qk)
    ctx = _check_step(slots, adapters, [(2, 7)], 0, use_kernels=True, interleave_qk=interleave_qk)
    assert ctx.token_slots is None and ctx.seg_indptr.tolist() == [0, 7]


def test_group_sub_projection_counts():
    assert {g: len(s) for g, s in GROUPS.items()} == {"qkv": 3, "o": 1, "gate_up": 2, "down": 1}


_TRITON_SCRIPT = """
import sys, tempfile, pathlib, torch
from tests.dataplane import test_lora_units as t
from dataplane.lora.slots import LoRASlots
tmp = pathlib.Path(tempfile.mkdtemp())
adapters = t._adapters(tmp, t.SPECS, interleave_qk=False)
slots = LoRASlots(t.TINY, 4, 8, torch.float32, torch.device("cpu"), kernel_layout=True)
t._check_step(slots, adapters, [(1, 1), (None, 1), (0, 1), (0, 9), (None, 5), (2, 3)], 3, use_kernels=True,
              interleave_qk=False)
print("ok")
"""


@pytest.mark.slow
def test_kernel_path_with_triton_interpreter():
    """The same step through the real Triton SGMV/BGMV kernels, in Triton's interpreter (a fresh process,
    so TRITON_INTERPRET is set before triton is imported)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TESSERA_KERNELS": "triton"}
    proc = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
