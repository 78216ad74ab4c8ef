"""Tokenizer and chat template, through Hugging Face's tokenizers (never hand-written).

For a GGUF, transformers converts the file's vocabulary, merges and chat template into a fast
tokenizer. That conversion takes seconds, so the result is cached on disk keyed by the file's
identity; later loads (every worker start, every test) read the cached tokenizer.json.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tokenizers.decoders import DecodeStream

from dataplane.models.disk_cache import cache_dir, file_key, temp_sibling


class Tokenizer:
    def __init__(self, hf_tokenizer: Any, eos_token_ids: tuple[int, ...]) -> None:
        self.hf = hf_tokenizer
        self.backend = hf_tokenizer._tokenizer  # tokenizers.Tokenizer (Rust) for the hot paths
        ids = set(eos_token_ids)
        if hf_tokenizer.eos_token_id is not None:
            ids.add(hf_tokenizer.eos_token_id)
        self.eos_token_ids = tuple(sorted(ids))
        self.vocab_size = self.backend.get_vocab_size()

    @classmethod
    def from_gguf(cls, path: Path, eos_token_ids: tuple[int, ...]) -> Tokenizer:
        from transformers import AutoTokenizer  # lazy: heavy, ~1 s after torch; only where a model is loaded

        cached = cache_dir("tokenizers") / file_key(path)
        if (cached / "tokenizer.json").exists():
            return cls(AutoTokenizer.from_pretrained(str(cached)), eos_token_ids)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        try:
            tmp = temp_sibling(cached)
            tok.save_pretrained(str(tmp))
            os.replace(tmp, cached)
        except OSError:
            pass  # a read-only home only costs the conversion again next time
        return cls(tok, eos_token_ids)

    @classmethod
    def from_directory(cls, path: Path, eos_token_ids: tuple[int, ...]) -> Tokenizer:
        from transformers import AutoTokenizer  # lazy: heavy, ~1 s after torch; only where a model is loaded

        return cls(AutoTokenizer.from_pretrained(str(path)), eos_token_ids)

    def encode(self, text: str) -> list[int]:
        return self.hf(text, add_special_tokens=True).input_ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> list[int]:
        if not getattr(self.hf, "chat_template", None):
            raise ValueError("messages: this model has no chat template; use a completion prompt instead")
        out = self.hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                          tools=tools or None)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def decode_stream(self, skip_special_tokens: bool = True) -> DecodeStream:
        return DecodeStream(skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id) or ""
