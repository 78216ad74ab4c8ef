"""The C++ CPU kernels (kernels/cpu/*.cpp) against their torch twins and the torch ops they replace:
GGUF Q4_1 / Q8_0 matmuls against dense float32 F.linear on the dequantized weight, paged decode
attention, rotary + KV write, float32 RMSNorm. Shapes are SmolLM2's; weights small enough to sit in
cache, so this times the arithmetic, not the weight streaming (benchmarks.decode_latency does that)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.kernels._harness import HIDDEN, Report, measure, write
from dataplane.models.attention import write_kv
from dataplane.models.layers import Rotary
from kernels import cpu_decode, gguf_cpu, gguf_layout
from kernels.reference import gguf_q4_1_linear_ref, gguf_q8_0_linear_ref, paged_decode_attention_ref


def _blocks(n: int, k: int, block: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(n + k)
    raw = torch.randint(0, 256, (n, k // 32 * block), dtype=torch.uint8, generator=gen)
    b = raw.view(n, -1, block)
    b[:, :, 0:2] = torch.full((n, k // 32), 0.01).half().view(torch.uint8).view(n, -1, 2)
    if block == 20:
        b[:, :, 2:4] = torch.full((n, k // 32), -0.05).half().view(torch.uint8).view(n, -1, 2)
        return gguf_layout.repack_q4_1(raw)
    b[:, :, 2:][b[:, :, 2:] == 128] = 129
    return gguf_layout.repack_q8_0(raw)


def main() -> None:
    report = Report("cpu_decode", torch.device("cpu"))
    for rows in (1, 8):
        for n, k in ((1536, HIDDEN), (HIDDEN, 1536)):
            packed = _blocks(n, k, 20)
            dense = gguf_layout.dequantize_q4_1(packed, k)
            x = torch.randn(rows, k)
            measure(report, f"Q4_1 {n}x{k} rows={rows}", {
                "reference": lambda x=x, p=packed, n=n, k=k: gguf_q4_1_linear_ref(x, p, n, k),
                "c++": lambda x=x, p=packed, n=n, k=k: gguf_cpu.q4_1_linear(x, p, n, k),
                "F.linear float32 (dequantized)": lambda x=x, w=dense: F.linear(x, w)})
    packed = _blocks(8192, HIDDEN, 34)
    x = torch.randn(1, HIDDEN)
    measure(report, "Q8_0 8192x576 rows=1 (a slice of the head)", {
        "reference": lambda: gguf_q8_0_linear_ref(x, packed, 8192, HIDDEN),
        "c++": lambda: gguf_cpu.q8_0_linear(x, packed, 8192, HIDDEN),
        "F.linear float32 (dequantized)": lambda w=gguf_layout.dequantize_q8_0(packed, HIDDEN): F.linear(x, w)})
    for seqs, ctx in ((1, 180), (32, 180)):
        kc, vc = torch.randn(400, 16, 3, 64), torch.randn(400, 16, 3, 64)
        tables = torch.randint(0, 400, (seqs, 12), dtype=torch.int32)
        lens = torch.full((seqs,), ctx, dtype=torch.int32)
        q = torch.randn(seqs, 9, 64)
        measure(report, f"decode attention {seqs} x {ctx} keys, 9/3 heads", {
            "reference": lambda q=q, t=tables, ln=lens, kc=kc, vc=vc: paged_decode_attention_ref(q, kc, vc, t, ln, 0.125),
            "c++": lambda q=q, t=tables, ln=lens, kc=kc, vc=vc: cpu_decode.paged_decode_attention(q, kc, vc, t, ln, 0.125)})
    rot = Rotary(64, 2048, 10000.0, 1.0, torch.device("cpu"))
    kc, vc = torch.zeros(64, 16, 3, 64), torch.zeros(64, 16, 3, 64)
    qkv, pos, slots = torch.randn(1, 15 * 64), torch.tensor([179]), torch.tensor([179])

    def torch_rope_kv():
        q, k = rot.rotate(qkv, rot.prepare(pos), 9, 3)
        write_kv(kc, vc, k, qkv[:, 12 * 64:].view(1, 3, 64), slots)
        return q, k

    measure(report, "rotary + KV write, 1 token", {
        "reference": torch_rope_kv,
        "c++": lambda: cpu_decode.rope_write_kv(qkv, rot.cos_sin, pos, kc, vc, slots, 9, 3)})
    w = torch.randn(HIDDEN)
    for rows in (1, 32):
        h = torch.randn(rows, HIDDEN)
        measure(report, f"RMSNorm float32 T={rows}", {
            "reference": lambda h=h: F.rms_norm(h, (HIDDEN,), w, 1e-5),
            "c++": lambda h=h: cpu_decode.rms_norm(h, w, 1e-5)})
    write(report)


if __name__ == "__main__":
    main()
