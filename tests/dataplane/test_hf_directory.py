"""A Hugging Face directory (config.json, safetensors, tokenizer.json) with other shapes: untied head, GQA 2."""

from __future__ import annotations

import pytest
import torch

from dataplane import LLM, SamplingParams
from dataplane.models.loader import load_model
from tests.dataplane.conftest import MODEL, hf_greedy


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory, smollm_fp32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = smollm_fp32.tokenizer.hf
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=344, num_hidden_layers=3,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=16, max_position_embeddings=512,
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, model


@pytest.mark.model
def test_hf_directory_matches_transformers(tiny_llama_dir):
    path, model = tiny_llama_dir
    loaded = load_model(str(path), torch.float32, progress=False)
    assert not loaded.args.tie_word_embeddings and loaded.args.num_kv_heads == 4 and loaded.args.head_dim == 16
    llm = LLM(str(path), dtype="float32", preloaded=loaded, block_size=8, max_num_batched_tokens=32)
    prompts = ["hello there", "a somewhat longer prompt that needs several blocks of eight tokens each"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    for o in outs:
        assert o.token_ids == hf_greedy(model, o.prompt_token_ids, 12)


def test_directory_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"num_attention_heads": 2, "hidden_size": 8, "vocab_size": 10, '
                                          '"intermediate_size": 8, "num_hidden_layers": 1}')
    with pytest.raises(ValueError, match="safetensors"):
        load_model(str(tmp_path), torch.float32, progress=False)


def test_model_alias_in_registry():
    from dataplane.models.registry import resolve_model_path

    assert resolve_model_path(MODEL).suffix == ".gguf"
