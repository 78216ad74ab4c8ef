from __future__ import annotations

from types import SimpleNamespace

from tokenizers.decoders import ByteLevel

from dataplane.worker.render import TokenText, _byte_decoder


def test_byte_level_alphabet_covers_every_byte_once():
    table = _byte_decoder()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["a"] == 0x61


def test_token_text_gives_exact_bytes_and_escapes_partial_characters():
    pieces = {1: "ĠHello", 2: "Ġæ", 3: "<|im_end|>"}
    tok = SimpleNamespace(backend=SimpleNamespace(decoder=ByteLevel()), id_to_token=pieces.__getitem__)
    text = TokenText(tok)
    assert text(1) == (" Hello", list(b" Hello"))
    assert text(2) == (" \\xe6", [0x20, 0xE6])  # half of a character: shown as OpenAI does
    assert text(3) == ("<|im_end|>", list(b"<|im_end|>"))
