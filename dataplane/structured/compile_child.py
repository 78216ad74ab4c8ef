"""The grammar compiler's child process: compiles what the engine sends it, one grammar at a time.

Run as a script (`python compile_child.py <max_threads>`), not as a module of the package, so it
imports xgrammar and the standard library only. Frames on stdin/stdout are an 8-byte big-endian
length and a payload. In: the tokenizer info (xgrammar's JSON), then one JSON request per compile
({"kind": json | json_object | regex | grammar, "text": ...}). Out: b"R" once ready, then per
request b"O" (it compiled; the grammar itself stays here, see compile_process.py) or b"E" +
xgrammar's error message. The parent kills this process when a compile overruns its deadline; it
exits by itself when stdin closes.
"""

from __future__ import annotations

import json
import os
import struct
import sys

_LEN = struct.Struct("!Q")


def _read(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(fd: int) -> bytes | None:
    head = _read(fd, _LEN.size)
    return None if head is None else _read(fd, _LEN.unpack(head)[0])


def _send(fd: int, payload: bytes) -> None:
    data = _LEN.pack(len(payload)) + payload
    while data:
        data = data[os.write(fd, data):]


def main() -> None:
    out = os.dup(1)
    os.dup2(2, 1)  # anything the library prints goes to stderr, never into the protocol
    max_threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    import xgrammar as xgr  # lazy: after the dup2 above, so that what the library prints never reaches stdout

    info_json = _recv(0)
    if info_json is None:
        return
    info = xgr.TokenizerInfo.deserialize_json(info_json.decode())
    compiler = xgr.GrammarCompiler(info, max_threads=max_threads, cache_enabled=False)
    _send(out, b"R")
    while (raw := _recv(0)) is not None:
        req = json.loads(raw)
        kind, text = req["kind"], req["text"]
        try:
            if kind == "json":
                compiler.compile_json_schema(text, any_whitespace=False)
            elif kind == "json_object":
                compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            elif kind == "regex":
                compiler.compile_regex(text)
            else:
                compiler.compile_grammar(text)
        except (RuntimeError, ValueError, TypeError) as exc:
            _send(out, b"E" + (str(exc).strip() or type(exc).__name__).encode())
            continue
        _send(out, b"O")


if __name__ == "__main__":
    main()
