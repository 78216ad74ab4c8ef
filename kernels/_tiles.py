"""Which output tile a GEMM program computes: the grouped ("swizzled") order of Triton's matmul tutorial.

Programs are numbered along bands of GROUP_M row tiles, column by column within a band, so the
programs running at once share the same few column tiles of the weight while those are in L2
instead of each streaming its own (the tutorial's L2 reuse; awq_gemm and fp8_gemm use GROUP_M=8).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program `pid`'s [BLOCK_M, BLOCK_N] tile of an [M, N] output -> (offs_m, offs_n, mask_m, mask_n)."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group_first = (pid // (GROUP_M * tiles_n)) * GROUP_M
    group_rows = tl.minimum(tiles_m - group_first, GROUP_M)
    pid_m = group_first + (pid % (GROUP_M * tiles_n)) % group_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // group_rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n, offs_m < M, offs_n < N
