"""Quantize a model into a loadable directory.

    python -m dataplane.quantize --method awq --model smollm2-135m-instruct --out DIR [--group-size 32]
                                 [--calibration FILE] [--seqs 8 --seq-len 256] [--grid 20]
    python -m dataplane.quantize --method fp8 --model smollm2-135m-instruct --out DIR

AWQ searches activation-aware scales on a calibration text (default: the repository's
dataplane/quantize/data/calibration.txt) and writes AutoAWQ's GEMM layout; FP8 writes per-channel
e4m3 weights. Both write config.json with quantization_config, model.safetensors and the
tokenizer. Load the result with ``LLM(model=DIR)``; check it with ``python -m dataplane.quantize.gate``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from dataplane.models.loader import read_weights
from dataplane.models.registry import resolve_model_path
from dataplane.models.tokenizer import Tokenizer
from dataplane.quantize.awq import AwqOptions, awq_quantize_model
from dataplane.quantize.export import FP8_CONFIG, awq_config, fp8_tensors, hf_config, write_checkpoint

DATA = Path(__file__).resolve().parent / "data"
CALIBRATION = DATA / "calibration.txt"


def load_tokenizer(path: Path, eos_token_ids: tuple[int, ...]) -> Tokenizer:
    return Tokenizer.from_gguf(path, eos_token_ids) if path.is_file() else Tokenizer.from_directory(path, eos_token_ids)


def calibration_ids(tokenizer: Tokenizer, text: str, num_seqs: int, seq_len: int) -> torch.Tensor:
    """[num_seqs, seq_len] consecutive windows of the tokenized text (fewer if the text is short)."""
    ids = tokenizer.hf(text, add_special_tokens=False).input_ids
    n = min(num_seqs, len(ids) // seq_len)
    if n < 1:
        raise ValueError(f"calibration: {len(ids)} tokens do not fill one sequence of {seq_len}")
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


def quantize(method: str, model: str, out: str | Path, *, group_size: int = 32,
             calibration: str | Path | None = None, num_seqs: int = 8, seq_len: int = 256, n_grid: int = 20, grid_search: bool = True,
             rounding: str = "rtn", keep_dense: tuple[str, ...] = (), progress: bool = True,
             options: AwqOptions | None = None) -> Path:
    """Write the quantized directory for `model` and return its path (`options` overrides the AWQ knobs)."""
    if method not in ("awq", "fp8"):
        raise ValueError(f"method: must be 'awq' or 'fp8', got {method!r}")
    path = resolve_model_path(model)
    args, tensors = read_weights(path, progress)
    tokenizer = load_tokenizer(path, args.eos_token_ids)
    if method == "fp8":
        return write_checkpoint(Path(out), {**hf_config(args, path, "bfloat16"), "quantization_config": FP8_CONFIG},
                                fp8_tensors(args, tensors), tokenizer)
    opts = options or AwqOptions(group_size=group_size, n_grid=n_grid, grid_search=grid_search, rounding=rounding,
                                 keep_dense=tuple(keep_dense))
    group_size, keep_dense = opts.group_size, opts.keep_dense
    text = Path(calibration or CALIBRATION).read_text()
    ids = calibration_ids(tokenizer, text, num_seqs, seq_len)
    quantized = awq_quantize_model(args, tensors, ids, opts, progress)
    config = {**hf_config(args, path, "float16"), "quantization_config": awq_config(group_size, list(keep_dense))}
    return write_checkpoint(Path(out), config, quantized, tokenizer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataplane.quantize", description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True, choices=("awq", "fp8"))
    parser.add_argument("--model", required=True, help="alias, .gguf file or Hugging Face directory")
    parser.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    # 32, not 64: SmolLM2's weights come from a Q4_1 GGUF (blocks of 32); measured on the held-out
    # text, group 64 costs +11-13% perplexity, group 32 +6% (docs/kernels.md).
    parser.add_argument("--group-size", type=int, default=32, help="AWQ: inputs per scale/zero group (default 32)")
    parser.add_argument("--calibration", help=f"AWQ: calibration text file (default {CALIBRATION.name} in the repo)")
    parser.add_argument("--seqs", type=int, default=8, help="AWQ: calibration sequences (default 8)")
    parser.add_argument("--seq-len", type=int, default=256, help="AWQ: tokens per calibration sequence (default 256)")
    parser.add_argument("--grid", type=int, default=20, help="AWQ: scale exponents tried per group (default 20)")
    parser.add_argument("--no-grid-search", action="store_true", help="AWQ: skip the per-group grid search")
    parser.add_argument("--rounding", choices=("rtn", "gptq"), default="rtn",
                        help="AWQ: round to nearest on searched ranges, or GPTQ's error-compensating rounding")
    parser.add_argument("--keep-dense", default="", help="AWQ: comma-separated projections left in float16, "
                        "e.g. q_proj,k_proj,v_proj (written as modules_to_not_convert)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    try:
        out = quantize(a.method, a.model, a.out, group_size=a.group_size, calibration=a.calibration, num_seqs=a.seqs,
                       seq_len=a.seq_len, n_grid=a.grid, grid_search=not a.no_grid_search,
                       rounding=a.rounding, keep_dense=tuple(n for n in a.keep_dense.split(",") if n))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} in {time.perf_counter() - t0:.1f} s")
    return 0

