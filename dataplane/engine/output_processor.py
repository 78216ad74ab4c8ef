"""Turns the core's per-step token outputs into RequestOutputs: text, stop strings, n > 1 fan-in."""

from __future__ import annotations

from dataclasses import dataclass, field

from dataplane.engine.detokenizer import IncrementalDetokenizer
from dataplane.models.tokenizer import Tokenizer
from dataplane.outputs import CompletionOutput, RequestMetrics, RequestOutput
from dataplane.request import Request
from dataplane.scheduler.output import EngineCoreOutput, TokenLogprobs


@dataclass(slots=True)
class _Completion:
    index: int
    request: Request  # the engine request behind this completion
    detok: IncrementalDetokenizer
    logprobs: list[TokenLogprobs] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    sent_tokens: int = 0  # tokens already handed out as deltas
    sent_logprobs: int = 0


@dataclass(slots=True)
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    completions: list[_Completion] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # from the first completion, once computed
    sent_prompt_logprobs: bool = False
    embedding: list[float] | None = None  # an embedding request's vector, once pooled

    @property
    def finished(self) -> bool:
        cs = self.completions
        if len(cs) == 1:
            return cs[0].finish_reason is not None
        return all(c.finish_reason is not None for c in cs)


def _add_tokens(detok: IncrementalDetokenizer, token_ids: list[int]) -> str | None:
    """Several tokens at once (an accepted speculative run) are fed one by one when stop strings are
    set: the output ends at the token that completed one, as it would have without speculation, and
    the tokens after it are neither kept nor counted."""
    if detok.matcher is None or len(token_ids) == 1:
        return detok.add_tokens(token_ids)
    for tok in token_ids:
        stop = detok.add_tokens([tok])
        if stop is not None:
            return stop
    return None


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, _Parent] = {}
        self.child_to_parent: dict[str, tuple[_Parent, _Completion]] = {}

    def add(self, parent_id: str, prompt: str | None, children: list[Request]) -> None:
        parent = _Parent(parent_id, prompt, children[0].prompt_token_ids)
        for i, child in enumerate(children):
            c = _Completion(i, child, IncrementalDetokenizer(self.tokenizer, child.sampling_params),
                            [] if child.sampling_params.logprobs is not None else None)
            parent.completions.append(c)
            self.child_to_parent[child.request_id] = (parent, c)
        self.parents[parent_id] = parent

    def children_of(self, parent_id: str) -> list[str]:
        parent = self.parents.get(parent_id)
        return [c.request.request_id for c in parent.completions] if parent else []

    def process(self, outputs: list[EngineCoreOutput], delta: bool, final_only: bool = False,
                ) -> tuple[list[RequestOutput], list[tuple[str, str]]]:
        """Returns the outputs to hand out, and (child id, stop string) pairs the core must finish.
        `final_only`: outputs only for requests that finished (the offline API waits for those)."""
        touched: dict[str, _Parent] = {}
        moved: dict[str, set[int]] = {}
        stops: list[tuple[str, str]] = []
        child_to_parent = self.child_to_parent
        for o in outputs:
            entry = child_to_parent.get(o.request_id)
            if entry is None:
                continue
            parent, c = entry
            if c.finish_reason is not None:
                continue
            stop_str = _add_tokens(c.detok, o.new_token_ids) if o.new_token_ids else None
            if o.prompt_logprobs is not None and parent.prompt_logprobs is None:
                parent.prompt_logprobs = [None, *o.prompt_logprobs]
            if o.embedding is not None:
                parent.embedding = o.embedding
            if o.new_logprobs and c.logprobs is not None:
                # one per token kept: a stop string inside a speculative run drops the tokens after it
                c.logprobs.extend(o.new_logprobs[: len(c.detok.token_ids) - len(c.logprobs)])
            if stop_str is not None:
                c.finish_reason, c.stop_reason = "stop", stop_str
                if o.finish_reason is None:
                    stops.append((o.request_id, stop_str))
            elif o.finish_reason is not None:
                c.finish_reason, c.stop_reason, c.error = o.finish_reason, o.stop_reason, o.error
            if c.finish_reason is not None:
                c.detok.finish()
            rid = parent.request_id
            if rid in touched:
                moved[rid].add(c.index)
            else:
                touched[rid] = parent
                moved[rid] = {c.index}
        results = []
        for rid, p in touched.items():
            finished = p.finished
            if finished or not final_only:
                results.append(self._output(p, moved[rid], delta))
            if finished:
                self._forget(p)
        return results, stops

    def abort(self, parent_id: str) -> RequestOutput | None:
        """Mark every unfinished completion aborted and return the final output."""
        parent = self.parents.get(parent_id)
        if parent is None:
            return None
        idx = set()
        for c in parent.completions:
            if c.finish_reason is None:
                c.finish_reason = "abort"
                idx.add(c.index)
        out = self._output(parent, idx, delta=True)
        self._forget(parent)
        return out

    def forget(self, parent_id: str) -> None:
        """Drop a request (its caller left); later outputs for it are ignored."""
        parent = self.parents.get(parent_id)
        if parent is not None:
            self._forget(parent)

    def _forget(self, parent: _Parent) -> None:
        self.parents.pop(parent.request_id, None)
        for c in parent.completions:
            self.child_to_parent.pop(c.request.request_id, None)

    def _output(self, parent: _Parent, moved: set[int], delta: bool) -> RequestOutput:
        if len(parent.completions) == 1:
            return self._single_output(parent, delta)
        comps = []
        for c in parent.completions:
            if delta and c.index not in moved:
                continue
            comps.append(self._completion(c, delta))
        first = parent.completions[0].request
        t = first.times
        last_token = max((c.request.times.last_token or 0.0) for c in parent.completions) or None
        finished_at = max((c.request.times.finished or 0.0) for c in parent.completions) or None
        metrics = RequestMetrics(t.arrival, t.first_scheduled,
                                 min((c.request.times.first_token for c in parent.completions
                                      if c.request.times.first_token is not None), default=None),
                                 (finished_at or last_token) if parent.finished else None)
        return self._request_output(parent, comps, first, metrics, delta)

    def _single_output(self, parent: _Parent, delta: bool) -> RequestOutput:
        """_output for the common n == 1 request (no fan-in to compute)."""
        c = parent.completions[0]
        t = c.request.times
        finished = c.finish_reason is not None
        metrics = RequestMetrics(t.arrival, t.first_scheduled, t.first_token,
                                 (t.finished or t.last_token) if finished else None)
        return self._request_output(parent, [self._completion(c, delta)], c.request, metrics, delta)

    @staticmethod
    def _completion(c: _Completion, delta: bool) -> CompletionOutput:
        finished = c.finish_reason is not None
        tokens = c.detok.token_ids
        if delta:
            text = c.detok.take_new_text(finished)
            token_ids = tokens[c.sent_tokens :]
            logprobs = c.logprobs[c.sent_logprobs :] if c.logprobs is not None else None
            c.sent_tokens = len(tokens)
            c.sent_logprobs = len(c.logprobs) if c.logprobs is not None else 0
        else:
            text, token_ids, logprobs = c.detok.text, list(tokens), c.logprobs
        return CompletionOutput(c.index, text, token_ids, c.finish_reason, c.stop_reason, logprobs, c.error)

    @staticmethod
    def _request_output(parent: _Parent, comps: list[CompletionOutput], first: Request, metrics: RequestMetrics,
                        delta: bool) -> RequestOutput:
        prompt_lps = parent.prompt_logprobs
        if delta:
            prompt_lps, parent.sent_prompt_logprobs = (None if parent.sent_prompt_logprobs else prompt_lps,
                                                       parent.sent_prompt_logprobs or prompt_lps is not None)
        return RequestOutput(parent.request_id, parent.prompt_token_ids, comps, parent.finished,
                             max(first.num_cached_tokens, 0), metrics, parent.prompt, prompt_lps, parent.embedding)
