"""Incremental detokenization and stop strings, per completion.

Text is produced with tokenizers' DecodeStream, which never yields a broken UTF-8 sequence (a
character split across tokens is held until complete). Stop strings are searched in the decoded
text, so they match when split across tokens; while a request runs, the last len(stop) - 1
characters are held back so a stop string is never streamed and then taken back. The search is an
Aho–Corasick automaton fed only the new text (stop_strings.py): its cost per token does not grow
with the number or length of the stop strings.
"""

from __future__ import annotations

from dataplane.engine.stop_strings import StopMatcher
from dataplane.models.tokenizer import Tokenizer
from dataplane.sampling_params import SamplingParams


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.stream = tokenizer.decode_stream(params.skip_special_tokens)
        self.token_ids: list[int] = []
        self.text = ""  # all decoded text (after a stop string: cut there)
        self.emitted = 0  # characters of `text` already handed out
        self.holdback = max((len(s) for s in params.stop), default=1) - 1
        self.stopped_on: str | None = None
        self.matcher = StopMatcher(params.stop) if params.stop else None

    def add_tokens(self, token_ids: list[int]) -> str | None:
        """Decode new tokens; return the stop string if one now appears in the text."""
        if len(token_ids) == 1:  # a decode step: no list to join
            self.token_ids.append(token_ids[0])
            new = self.stream.step(self.tokenizer.backend, token_ids[0]) or ""
        else:
            pieces = []
            for tok in token_ids:
                self.token_ids.append(tok)
                piece = self.stream.step(self.tokenizer.backend, tok)
                if piece:
                    pieces.append(piece)
            new = "".join(pieces)
        if new:
            self.text += new
        if self.matcher is None or not new:
            return None
        found = self.matcher.feed(new)  # positions in self.text: the matcher has seen all of it
        if found is None:
            return None
        i, s = found
        self.text = self.text[: i + len(s)] if self.params.include_stop_str_in_output else self.text[:i]
        self.stopped_on = s
        return s

    def finish(self) -> None:
        """At the end, take the whole-sequence decode so trailing bytes are never lost."""
        if self.stopped_on is None:
            full = self.tokenizer.decode(self.token_ids, self.params.skip_special_tokens)
            if full.startswith(self.text):
                self.text = full

    def take_new_text(self, finished: bool) -> str:
        end = len(self.text) if finished else max(self.emitted, len(self.text) - self.holdback)
        new = self.text[self.emitted : end]
        self.emitted = end
        return new
