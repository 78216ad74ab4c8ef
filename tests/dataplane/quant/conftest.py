"""Triton's interpreter for the kernel-wiring tests, set up exactly as tests/kernels does.

Importing that conftest sets TRITON_INTERPRET=1 before any kernel module loads (and re-imports
a triton that another package's tests loaded compiled); one module object serves both folders.
"""

from __future__ import annotations

import tests.kernels.conftest  # noqa: F401
