"""Real-model fixtures: weights are loaded once per session and shared by engines (read-only)."""

from __future__ import annotations

import pytest
import torch

from dataplane.models.loader import LoadedModel, load_model
from dataplane.models.registry import resolve_model_path

MODEL = "smollm2-135m-instruct"

# Eight prompts of very different lengths (a few tokens to a few hundred), some sharing prefixes.
_LONG = ("The history of computing is a story of abstraction. Early machines were programmed by "
         "rewiring panels; later, stored programs let the same hardware do many jobs. ") * 6
PROMPTS = [
    "Hi",
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List three colours of the rainbow:",
    _LONG + "In summary,",
    _LONG + "The most important idea was",
    "Translate to French: 'The cat sleeps on the warm windowsill while the rain falls outside.'",
    "A recipe for pancakes needs flour, eggs, milk and" + " a pinch of salt." * 20,
]


@pytest.fixture(scope="session")
def smollm_fp32() -> LoadedModel:
    return load_model(MODEL, torch.float32, progress=False)


@pytest.fixture(scope="session")
def smollm_bf16() -> LoadedModel:
    return load_model(MODEL, torch.bfloat16, progress=False)


@pytest.fixture(scope="session")
def hf_reference():
    """transformers' LlamaForCausalLM loaded from the same GGUF, float32: the parity oracle."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(MODEL)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    return model


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()
