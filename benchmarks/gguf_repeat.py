"""A full-depth GGUF grown from a cut one: its decoder blocks repeated, in order, up to N.

    python -m benchmarks.gguf_repeat .gpu/smollm2-6l.gguf /tmp/smollm2-30l.gguf --layers 30

Why: a lent GPU machine receives at most 64 MiB, SmolLM2-135M's GGUF is 98 MB, so
`benchmarks/gguf_truncate.py` ships its first 6 blocks and this rebuilds 30 on the machine (block i
is block i mod 6 of the cut). Every shape, the block formats, the tokenizer and the depth are the real
model's, so speed is measured where it matters; the outputs are not meaningful and nothing judges them
against another model (the GPU check compares such a model only with itself: graphs against eager).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.gguf_truncate import block_count, rewrite_layers


def repeat(src: Path, dst: Path, layers: int) -> int:
    """Write `dst` with `layers` blocks, block i a copy of `src`'s block i mod (its block count)."""
    if layers < 1:
        raise ValueError(f"--layers must be >= 1, got {layers}")
    have = block_count(src)
    return rewrite_layers(src, dst, [i % have for i in range(layers)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args()
    args.dst.parent.mkdir(parents=True, exist_ok=True)
    size = repeat(args.src, args.dst, args.layers)
    print(f"wrote {args.dst} ({size / 2**20:.1f} MiB, {args.layers} layers)")


if __name__ == "__main__":
    main()
