"""Prompt logprobs and unknown fields end to end: the official `openai` client → the gateway (uvicorn)
→ a real SmolLM2-135M worker in float32, checked against transformers' log-softmax on the same GGUF.

Tolerance: 1e-4 nats per token (float32 on both sides; they differ by reduction order only)."""

from __future__ import annotations

import json

import openai
import pytest
import torch

from tests.dataplane.worker.process import MODEL, running

from .conftest import serving_gateway

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.django_db(transaction=True)]

TOL = 1e-4
TEXT = "The quick brown fox jumps over the lazy dog. Tessera serves language models to many tenants at once."
QUESTION = "Question: What is the capital of France?\nAnswer:"
ANSWERS = [" Paris", " London", " a banana", " Berlin"]


@pytest.fixture(scope="module")
def real_worker():
    with running("--dtype", "float32") as worker:
        yield worker


@pytest.fixture(scope="module")
def reference():
    """(the worker's tokenizer, ids -> logprob of each token 1.. under transformers, float32)."""
    from transformers import AutoModelForCausalLM

    from dataplane.models.registry import resolve_model_path
    from dataplane.models.tokenizer import Tokenizer

    path = resolve_model_path(MODEL)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> list[float]:
        with torch.inference_mode():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
        return lp.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()

    return Tokenizer.from_gguf(path, ()), logprobs


@pytest.fixture
def client(real_worker, gateway, tenant_key):
    with serving_gateway(gateway, real_worker) as url:
        _, secret = tenant_key.sync(requests_per_minute=1000, key_fields={"allowed_adapters": ["none"]})
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=120)


def _worst(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want)
    return max(abs(g - w) for g, w in zip(got, want, strict=True))


def test_echo_scores_a_text_as_transformers_does_cached_or_not(client, reference):
    tok, hf = reference
    ids = tok.encode(TEXT)
    want = hf(ids)
    scored = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=0, echo=True, logprobs=3)
    choice = scored.choices[0]
    assert choice.text == TEXT and choice.finish_reason == "length"
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert "".join(lp.tokens) == TEXT and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert _worst(lp.token_logprobs[1:], want) <= TOL
    assert all(len(t) >= 3 for t in lp.top_logprobs[1:])  # the token itself and 3 alternatives (may overlap)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]

    # The prompt's blocks are now in the prefix cache (a plain request shows the hit); a request
    # asking for prompt logprobs skips the lookup and computes every position again: equal values.
    plain = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=1, temperature=0)
    assert plain.usage.prompt_tokens_details.cached_tokens > 0
    again = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=0, echo=True, logprobs=3)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert _worst(again.choices[0].logprobs.token_logprobs[1:], want) <= TOL


def test_echo_with_a_completion_puts_the_prompt_first(client, reference):
    tok, hf = reference
    ids = tok.encode(TEXT)
    out = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=4, echo=True, logprobs=1, temperature=0)
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(TEXT) and len(lp.tokens) == len(ids) + out.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and all(x is not None for x in lp.token_logprobs[1:])
    assert _worst(lp.token_logprobs[1 : len(ids)], hf(ids)) <= TOL
    # the completion's offsets continue after the echoed prompt
    assert lp.text_offset[len(ids)] == len(TEXT)
    assert lp.text_offset == sorted(lp.text_offset)


def test_multiple_choice_ranks_answers_as_transformers_does(client, reference):
    tok, hf = reference
    n_ctx = len(tok.encode(QUESTION))
    api, ref = [], []
    for answer in ANSWERS:
        ids = tok.encode(QUESTION + answer)
        assert ids[:n_ctx] == tok.encode(QUESTION)  # the answer starts on a token boundary
        out = client.completions.create(model=MODEL, prompt=QUESTION + answer, max_tokens=0, echo=True, logprobs=0)
        api.append(sum(out.choices[0].logprobs.token_logprobs[n_ctx:]))
        ref.append(sum(hf(ids)[n_ctx - 1 :]))
    rank = sorted(range(len(ANSWERS)), key=lambda i: -api[i])
    assert rank == sorted(range(len(ANSWERS)), key=lambda i: -ref[i])
    assert ANSWERS[rank[0]] == " Paris"
    assert _worst(api, ref) <= TOL * 4


def test_vllm_prompt_logprobs_on_both_endpoints(client, reference):
    tok, hf = reference
    ids = tok.encode(TEXT)
    want = hf(ids)
    out = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=2, temperature=0,
                                    extra_body={"prompt_logprobs": 2})
    plp = out.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    got = [entry[str(t)]["logprob"] for entry, t in zip(plp[1:], ids[1:], strict=True)]
    assert _worst(got, want) <= TOL
    # the token, plus its 2 best alternatives (2 entries when it is one of them); ranks from 1
    assert all(len(e) in (2, 3) and min(v["rank"] for v in e.values()) == 1 for e in plp[1:])
    assert out.choices[0].logprobs is None  # no completion logprobs were asked for

    messages = [{"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0,
                                          extra_body={"prompt_logprobs": 0})
    chat_ids = tok.apply_chat_template(messages)
    plp = chat.model_extra["prompt_logprobs"]
    assert len(plp) == len(chat_ids) == chat.usage.prompt_tokens
    got = [entry[str(t)]["logprob"] for entry, t in zip(plp[1:], chat_ids[1:], strict=True)]
    assert _worst(got, hf(chat_ids)) <= TOL

    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, stream=True,
                                       extra_body={"prompt_logprobs": 0})
    assert exc.value.body["param"] == "prompt_logprobs"


def test_unknown_fields_are_refused_and_json_object_schemas_honored(client):
    messages = [{"role": "user", "content": "How many legs does a cat have? Answer in JSON."}]
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,
                                       extra_body={"min_tokens": 3})
    assert exc.value.body["param"] == "min_tokens" and exc.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=0)  # 0 only scores a prompt

    schema = {"type": "object", "properties": {"legs": {"type": "integer"}}, "required": ["legs"],
              "additionalProperties": False}
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0,
                                         response_format={"type": "json_object", "schema": schema})
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"legs"} and isinstance(value["legs"], int)


def test_a_batch_of_prompts_with_n_gets_each_prompts_own_logprobs(client, reference):
    tok, hf = reference
    prompts = [TEXT, QUESTION]
    out = client.completions.create(model=MODEL, prompt=prompts, max_tokens=2, n=2, echo=True, logprobs=0,
                                    temperature=1.0, seed=3)
    assert len(out.choices) == 4
    for choice in out.choices:
        prompt = prompts[choice.index // 2]  # prompt-major: index = prompt x n + i
        ids = tok.encode(prompt)
        lp = choice.logprobs
        assert choice.text.startswith(prompt) and "".join(lp.tokens[: len(ids)]) == prompt
        assert _worst(lp.token_logprobs[1 : len(ids)], hf(ids)) <= TOL


def test_streamed_echo_with_logprobs_equals_the_whole_response(client):
    kw = dict(model=MODEL, prompt=[TEXT, QUESTION], max_tokens=3, echo=True, logprobs=2, temperature=0)
    whole = client.completions.create(**kw)
    chunks = [c for c in client.completions.create(**kw, stream=True) if c.choices]
    for want in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices[0].index == want.index]
        assert mine[0].text == [TEXT, QUESTION][want.index] and mine[0].logprobs.token_logprobs[0] is None
        tokens = [t for ch in mine if ch.logprobs for t in ch.logprobs.tokens]
        lps = [x for ch in mine if ch.logprobs for x in ch.logprobs.token_logprobs]
        offsets = [x for ch in mine if ch.logprobs for x in ch.logprobs.text_offset]
        assert "".join(ch.text for ch in mine) == want.text
        assert tokens == want.logprobs.tokens and offsets == want.logprobs.text_offset
        assert lps[0] is None and _worst(lps[1:], want.logprobs.token_logprobs[1:]) <= TOL
