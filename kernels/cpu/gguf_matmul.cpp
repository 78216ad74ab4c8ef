// y = x W^T for W kept in GGUF's Q4_1 or Q8_0 blocks, on the CPU: the batch-1 decode path.
//
// Why by hand: a decode step reads every weight once, so at batch 1 it runs at memory speed, and
// the file's 4-bit blocks are 0.6 bytes a weight against 2 for bf16 and 4 for float32. PyTorch's
// packed-int4 matmul takes another layout, wants bf16 activations and, on an AVX2-only CPU, runs
// float32 activations scalar (2.6 ms for a 1536 x 576 product at batch 1 against 0.13 ms dense).
// This follows llama.cpp's CPU path: activations are quantized to 8 bits in blocks of 32 (scale
// d_x, sum s_x), and each block's dot product runs on integers:
//   Q4_1 (w = d_w q + m_w, q in 0..15):  d_w d_x sum(q_w q_x) + m_w s_x,   s_x = d_x sum(q_x)
//   Q8_0 (w = d_w q, q in -127..127):    d_w d_x sum(q_w q_x)
// Rows come in the layout of kernels/gguf_layout.py (each row's nibbles or int8 first, then its
// fp16 scales, then its fp16 minimums): eight blocks' scales convert with one F16C instruction and
// two Q4_1 blocks' nibbles load as 32 bytes, against activations stored pair by pair to match.
// Four weight rows run side by side (independent accumulators, one activation load for all), and
// the rows two groups ahead are prefetched: gguf_dot.h's project_from, the loop gguf_decoder.cpp
// runs too (the measurements are beside it).
// kernels/reference.py (gguf_q4_1_linear_ref, gguf_q8_0_linear_ref) is the same arithmetic in
// torch; tests/kernels/test_cpu_kernels.py holds them together.

#include "ops.h"

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_dot.h"

namespace {

using namespace tessera_gguf;

// Row groups per parallel task: a task then streams tens of KB of weights (a thread wake-up costs
// microseconds), and 2-16 threads still share even a 192-row k projection.
constexpr int64_t GRAIN = 8;

torch::Tensor gguf_linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t out_features,
                          int64_t in_features, bool q4_1) {
  TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu(), "gguf_linear: CPU tensors only");
  TORCH_CHECK(in_features > 0 && in_features % QK == 0, "gguf_linear: in_features must be a positive multiple of 32, got ",
              in_features);
  const int64_t nb = in_features / QK;
  const int64_t row_bytes = nb * (q4_1 ? 20 : 34);
  TORCH_CHECK(blocks.scalar_type() == torch::kUInt8 && blocks.dim() == 2 && blocks.is_contiguous() &&
                  blocks.size(0) == out_features && blocks.size(1) == row_bytes,
              "gguf_linear: blocks must be contiguous uint8 [", out_features, ", ", row_bytes, "], got ",
              blocks.scalar_type(), " ", blocks.sizes());
  TORCH_CHECK(x.dim() == 2 && x.size(1) == in_features, "gguf_linear: x must be [rows, ", in_features, "], got ",
              x.sizes());
  const auto xf = x.to(torch::kFloat32).contiguous();
  const int64_t m = xf.size(0);
  thread_local QuantizedRows xq;  // reused: a decode step makes hundreds of these calls
  quantize_rows(xf.data_ptr<float>(), m, in_features, q4_1, xq);

  auto y = torch::empty({m, out_features}, xf.options());
  float* out = y.data_ptr<float>();
  const Proj p{blocks.data_ptr<uint8_t>(), out_features, in_features, row_bytes, q4_1};
  const QuantizedRows& xr = xq;  // the workers read the caller's buffers
  // Each task's weight rows stay in L1 while every activation row passes over them.
  at::parallel_for(0, (out_features + ROWS - 1) / ROWS, GRAIN, [&](int64_t begin, int64_t end) {
    project(p, xr, begin, end, [&](int64_t r, int64_t n, float v) { out[r * out_features + n] = v; });
  });
  return x.scalar_type() == torch::kFloat32 ? y : y.to(x.scalar_type());
}

}  // namespace

torch::Tensor q4_1_linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t out_features,
                          int64_t in_features) {
  return gguf_linear(x, blocks, out_features, in_features, true);
}

torch::Tensor q8_0_linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t out_features,
                          int64_t in_features) {
  return gguf_linear(x, blocks, out_features, in_features, false);
}

bool vectorized() {
#ifdef TESSERA_AVX2
  return true;
#else
  return false;
#endif
}
