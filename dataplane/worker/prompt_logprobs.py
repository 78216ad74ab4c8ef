"""Prompt logprobs in the two shapes clients read them.

- Completions with `echo` and `logprobs: k` (OpenAI's legacy API, how evaluation harnesses score a
  continuation): the prompt's tokens lead the choice's `logprobs` lists, the first with a null
  logprob and null alternatives (nothing predicts it), then the completion's tokens.
- vLLM's `prompt_logprobs: k` extension, on both endpoints: a list with one entry per prompt token,
  null first, then `{token_id: {logprob, rank, decoded_token}}` for the token and its k alternatives.
"""

from __future__ import annotations

from typing import Any

import orjson

from dataplane.scheduler.output import TokenLogprobs
from dataplane.worker.render import TokenText


def echo_logprobs(entries: list[TokenLogprobs | None], prompt_ids: list[int], k: int, text: TokenText
                  ) -> dict[str, Any]:
    """Completions' shape for the echoed prompt, offsets from the start of the returned text."""
    tokens, lps, tops, offsets = [], [], [], []
    offset = 0
    entries = list(entries) + [None] * (len(prompt_ids) - len(entries))
    for tid, e in zip(prompt_ids, entries, strict=True):
        tok = text(tid)[0]
        tokens.append(tok)
        offsets.append(offset)
        offset += len(tok)
        if e is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(e.logprob)
        top = {tok: e.logprob}
        for alt, lp in e.top[:k]:
            top.setdefault(text(alt)[0], lp)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def join(prompt: dict[str, Any], completion: dict[str, Any] | None) -> dict[str, Any]:
    """The echoed prompt's lists followed by the completion's."""
    if completion is None:
        return prompt
    return {key: prompt[key] + completion[key] for key in prompt}


def vllm_prompt_logprobs(entries: list[TokenLogprobs | None], k: int, text: TokenText
                         ) -> list[dict[str, dict[str, Any]] | None]:
    out: list[dict[str, dict[str, Any]] | None] = []
    for e in entries:
        if e is None:
            out.append(None)
            continue
        entry = {str(e.token_id): {"logprob": e.logprob, "rank": e.rank, "decoded_token": text(e.token_id)[0]}}
        for rank, (alt, lp) in enumerate(e.top[:k], 1):
            entry.setdefault(str(alt), {"logprob": lp, "rank": rank, "decoded_token": text(alt)[0]})
        out.append(entry)
    return out


def add_to_response(body: bytes, *, chat: bool, prompts: list[list[int]], n: int, echo: list[str] | None,
                    echo_k: int | None, vllm_k: int | None, computed: dict[int, list[TokenLogprobs | None]],
                    text: TokenText) -> bytes:
    """A whole response with the prompt logprobs merged in (only requests that asked pay the re-encode).

    `computed` maps a prompt's index to its entries; completions' choices are prompt-major (index // n)."""
    doc = orjson.loads(body)
    if chat:
        if vllm_k is not None:
            doc["prompt_logprobs"] = vllm_prompt_logprobs(computed.get(0, []), vllm_k, text)
        return orjson.dumps(doc)
    for choice in doc["choices"]:
        i = choice["index"] // n
        entries = computed.get(i, [])
        if vllm_k is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(entries, vllm_k, text)
        if echo_k is not None and echo is not None:
            head = echo_logprobs(entries, prompts[i], echo_k, text)
            tail = choice.get("logprobs")
            if tail is not None:
                shift = len(echo[i])
                tail = {**tail, "text_offset": [o + shift for o in tail["text_offset"]]}
            choice["logprobs"] = join(head, tail)
    return orjson.dumps(doc)
