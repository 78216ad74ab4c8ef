"""A local cache of things derived from a model file (converted tokenizer, dequantized weights).

Parsing a GGUF is slow in Python (about 4 s of the reader building the tokenizer arrays, then
dequantization), and every worker start and test pays it; the derived artefacts load in well
under a second. Entries are keyed by the source file's path, size and mtime, written atomically,
and live outside the repository (`TESSERA_CACHE_DIR`, default ~/.cache/tessera).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir(kind: str) -> Path:
    root = os.environ.get("TESSERA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tessera")
    return Path(root) / kind


def file_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]


def temp_sibling(target: Path) -> Path:
    """A temporary name next to `target`, for write-then-rename."""
    return target.with_name(f".{target.name}.tmp{os.getpid()}")
