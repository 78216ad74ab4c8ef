"""Quantized drop-in replacements for a projection's dense weight.

Each layer is called like the engine's dense projection (``layer(x)``, x [..., in]) and reports
``weight_bytes``; ``dense_weight()`` gives the float twin it computes with, for tests and for
the quality gate.
"""

from dataplane.quant.base import DenseLinear, LinearLayer
from dataplane.quant.fp8 import Fp8Linear
from dataplane.quant.int4 import Int4Linear
from dataplane.quant.int8 import Int8Linear

__all__ = ["DenseLinear", "Fp8Linear", "Int4Linear", "Int8Linear", "LinearLayer"]
