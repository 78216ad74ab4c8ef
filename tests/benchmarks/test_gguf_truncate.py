"""benchmarks/gguf_truncate.py: a smaller real-weights GGUF for the GPU check (a lent machine takes 64 MiB)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gguf_truncate import truncate
from dataplane.models.loader import load_model
from dataplane.models.registry import resolve_model_path


def test_the_first_layers_are_kept_exactly_with_the_tokenizer(tmp_path):
    src = resolve_model_path("smollm2-135m-instruct")
    out = tmp_path / "two.gguf"
    size = truncate(src, out, 2)
    assert size == out.stat().st_size and size < 0.4 * src.stat().st_size
    small = load_model(str(out), torch.float32, progress=False)
    full = load_model("smollm2-135m-instruct", torch.float32, progress=False)
    assert small.args.num_layers == 2 and small.args.hidden_size == full.args.hidden_size
    for a, b in zip(small.model.layers, full.model.layers[:2], strict=False):
        assert torch.equal(a.gate_up_proj.weight, b.gate_up_proj.weight)
    assert torch.equal(small.model.embed, full.model.embed)
    assert small.tokenizer.encode("The capital of France") == full.tokenizer.encode("The capital of France")
    with pytest.raises(ValueError, match="--layers must be 1..30"):
        truncate(src, tmp_path / "none.gguf", 31)
