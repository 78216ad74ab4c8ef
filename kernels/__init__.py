"""GPU kernels for the engine's hot ops, each with a plain-torch twin in kernels.reference.

Import ops through kernels.dispatch, which picks the Triton kernel on CUDA devices and the
reference on the CPU (TESSERA_KERNELS forces either). Importing this package does not import
triton.
"""

from kernels.dispatch import use_triton

__all__ = ["use_triton"]
