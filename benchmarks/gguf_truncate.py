"""A GGUF with only the first N decoder layers of another: a smaller real-weights model.

    python -m benchmarks.gguf_truncate --layers 6 --out .gpu/smollm2-6l.gguf [--model smollm2-135m-instruct]

Why: the GPU check (benchmarks/gpu_check.py) compares the CUDA + Triton engine with the CPU path on
one model file, and the machine a GPU is lent on receives at most 64 MiB with the working tree;
SmolLM2-135M's GGUF is 98 MB. The first layers keep every shape, block format and the tokenizer
(the check is about the kernels and the engine, not the model's quality). Metadata is copied as
`gguf`'s own gguf_new_metadata script copies it, with `<arch>.block_count` set to N.
`benchmarks/gguf_repeat.py` grows such a cut back to full depth on the GPU machine.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dataplane.models.registry import resolve_model_path

_BLOCK = re.compile(r"blk\.(\d+)\.(.*)")


def rewrite_layers(src: Path, dst: Path, sources: list[int]) -> int:
    """Write `dst` as `src` with decoder block i of the new file copied from block `sources[i]` of `src`
    (every other tensor and all metadata as they are, the block count set); returns its size in bytes."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    block_count = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    have = int(reader.fields[block_count].contents())
    if not sources or any(not 0 <= s < have for s in sources):
        raise ValueError(f"layers: every source block must be in 0..{have - 1} for {src.name}, got {sources}")
    writer = gguf.GGUFWriter(str(dst), arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        value = len(sources) if field.name == block_count else field.contents()
        writer.add_key_value(field.name, value, val_type, sub_type=sub_type)
    blocks: dict[int, list[tuple[str, object]]] = {}
    plan: list[tuple[str, object]] = []  # (name in the new file, tensor of src), in the source's order
    for t in reader.tensors:
        m = _BLOCK.match(t.name)
        if m is None:
            plan.append((t.name, t))
        else:
            blocks.setdefault(int(m.group(1)), []).append((m.group(2), t))
    for i, s in enumerate(sources):
        plan += [(f"blk.{i}.{rest}", t) for rest, t in blocks.get(s, [])]
    for name, t in plan:
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, t in plan:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return dst.stat().st_size


def block_count(path: Path) -> int:
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    return int(reader.fields[gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)].contents())


def truncate(src: Path, dst: Path, layers: int) -> int:
    """Write `dst` with `src`'s first `layers` blocks; returns its size in bytes."""
    have = block_count(src)
    if not 0 < layers <= have:
        raise ValueError(f"--layers must be 1..{have} for {src.name}, got {layers}")
    return rewrite_layers(src, dst, list(range(layers)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    size = truncate(resolve_model_path(args.model), args.out, args.layers)
    print(f"wrote {args.out} ({size / 2**20:.1f} MiB, {args.layers} layers)")


if __name__ == "__main__":
    main()
