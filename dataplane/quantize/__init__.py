"""The quantization tools: make a quantized checkpoint and decide whether it may serve.

They stand above the engine (the gate runs it), unlike `dataplane/quant/`, the quantized layers and the
checkpoint reader the model loads at run time:

- `make.py` (`python -m dataplane.quantize`): AWQ's activation-aware search (`awq.py`) or per-channel FP8,
  written as a loadable directory (`export.py`);
- `gate.py` (`python -m dataplane.quantize.gate`): the quality gate, held-out perplexity and greedy
  agreement against the dense model (`eval.py`), which a worker runs before a quantized replica serves;
- `data/`: the calibration and held-out texts.
"""
