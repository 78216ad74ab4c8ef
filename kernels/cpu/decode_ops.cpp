// The small per-layer ops of a CPU decode step, each one call instead of a dozen torch ops.
//
// Why: at batch 1 a 135M model's step is ~30 layers x ~40 torch ops of a few microseconds each
// (dispatch, allocation, an OpenMP region), more time than its weights take to stream once they
// are 4-bit. Attention over the paged cache was the largest share (block gather, a block-diagonal
// query, two batched matmuls, mask, softmax, stack: ~20 ops a layer), then RMSNorm (F.rms_norm
// took 21-29 us for one 576-wide row on an AVX2 EPYC). Twins: kernels/reference.py's
// paged_decode_attention_ref (the Triton kernel's signature) and F.rms_norm.

#include "ops.h"

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TESSERA_AVX2 1
#endif

namespace {

inline float to_float(float v) { return v; }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }

// dot(q, k) over d values (q float32, k float32 or bf16).
template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  int64_t i = 0;
  float total = 0.f;
#ifdef TESSERA_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= d; i += 8) {
    __m256 kv;
    if constexpr (std::is_same_v<T, float>) {
      kv = _mm256_loadu_ps(k + i);
    } else {  // bf16: the high half of a float32
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i));
      kv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv, acc);
  }
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  total = _mm_cvtss_f32(lo);
#endif
  for (; i < d; ++i) total += q[i] * to_float(k[i]);
  return total;
}

// out += p * v over d values.
template <typename T>
inline void axpy(float p, const T* v, float* out, int64_t d) {
  int64_t i = 0;
#ifdef TESSERA_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= d; i += 8) {
    __m256 vv;
    if constexpr (std::is_same_v<T, float>) {
      vv = _mm256_loadu_ps(v + i);
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i));
      vv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, vv, _mm256_loadu_ps(out + i)));
  }
#endif
  for (; i < d; ++i) out[i] += p * to_float(v[i]);
}

template <typename T>
void decode_attention(const float* q, const T* kc, const T* vc, const int64_t* tables, int64_t table_width,
                      const int64_t* lens, float* out, int64_t seqs, int64_t heads, int64_t kv_heads, int64_t d,
                      int64_t block_size, int64_t num_blocks, float scale) {
  const int64_t group = heads / kv_heads;
  const int64_t row = kv_heads * d;  // one token's keys in the cache, all KV heads
  // One task per (sequence, KV head): its `group` query heads share every key and value read.
  const int64_t grain = std::max<int64_t>(1, 8 / std::max<int64_t>(group, 1));
  at::parallel_for(0, seqs * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(static_cast<size_t>(group * d));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / kv_heads, h = task % kv_heads;
      const int64_t n = lens[s];
      const int64_t* table = tables + s * table_width;
      scores.resize(static_cast<size_t>(std::max<int64_t>(n, 1) * group));
      std::fill(acc.begin(), acc.end(), 0.f);
      float* o = out + (s * heads + h * group) * d;
      if (n <= 0) {  // an empty context attends to nothing: zeros, as the reference gives
        std::fill(o, o + group * d, 0.f);
        continue;
      }
      std::vector<float> maxes(static_cast<size_t>(group), -std::numeric_limits<float>::infinity());
      for (int64_t t = 0; t < n; ++t) {
        const int64_t blk = table[t / block_size];
        TORCH_CHECK(blk >= 0 && blk < num_blocks, "paged_decode_attention: block id ", blk, " out of range");
        const T* k = kc + (blk * block_size + t % block_size) * row + h * d;
        for (int64_t g = 0; g < group; ++g) {
          const float sc = dot(q + (s * heads + h * group + g) * d, k, d) * scale;
          scores[g * n + t] = sc;
          maxes[g] = std::max(maxes[g], sc);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) {
          const float e = std::exp(scores[g * n + t] - maxes[g]);
          scores[g * n + t] = e;
          sum += e;
        }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < n; ++t) scores[g * n + t] *= inv;
      }
      for (int64_t t = 0; t < n; ++t) {
        const int64_t blk = table[t / block_size];
        const T* v = vc + (blk * block_size + t % block_size) * row + h * d;
        for (int64_t g = 0; g < group; ++g) axpy(scores[g * n + t], v, acc.data() + g * d, d);
      }
      std::copy(acc.begin(), acc.end(), o);
    }
  });
}

}  // namespace

torch::Tensor paged_decode_attention_cpu(const torch::Tensor& q, const torch::Tensor& key_cache,
                                         const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                                         const torch::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes(),
              "paged_decode_attention: q [S, H, D] and caches [blocks, block_size, Hkv, D] expected");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "paged_decode_attention: caches must be contiguous");
  TORCH_CHECK(key_cache.scalar_type() == value_cache.scalar_type() &&
                  (key_cache.scalar_type() == torch::kFloat32 || key_cache.scalar_type() == torch::kBFloat16),
              "paged_decode_attention: float32 or bfloat16 caches");
  const int64_t seqs = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(1), kv_heads = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == d && kv_heads > 0 && heads % kv_heads == 0,
              "paged_decode_attention: head counts or sizes do not match");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == seqs && context_lens.numel() == seqs,
              "paged_decode_attention: one block table row and one length per sequence");
  const auto tables = block_tables.to(torch::kInt64).contiguous();
  const auto lens = context_lens.to(torch::kInt64).contiguous();
  const int64_t width = tables.size(1);
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t s = 0; s < seqs; ++s) {
    TORCH_CHECK(lp[s] >= 0 && lp[s] <= width * block_size, "paged_decode_attention: context length ", lp[s],
                " does not fit ", width, " blocks");
  }
  const auto qf = q.to(torch::kFloat32).contiguous();
  auto out = torch::empty({seqs, heads, d}, qf.options());
  if (key_cache.scalar_type() == torch::kFloat32) {
    decode_attention<float>(qf.data_ptr<float>(), key_cache.data_ptr<float>(), value_cache.data_ptr<float>(),
                            tables.data_ptr<int64_t>(), width, lp, out.data_ptr<float>(), seqs, heads, kv_heads, d,
                            block_size, num_blocks, static_cast<float>(scale));
  } else {
    decode_attention<c10::BFloat16>(qf.data_ptr<float>(), key_cache.data_ptr<c10::BFloat16>(),
                                    value_cache.data_ptr<c10::BFloat16>(), tables.data_ptr<int64_t>(), width, lp,
                                    out.data_ptr<float>(), seqs, heads, kv_heads, d, block_size, num_blocks,
                                    static_cast<float>(scale));
  }
  return q.scalar_type() == torch::kFloat32 ? out : out.to(q.scalar_type());
}

// y = x / sqrt(mean(x^2) + eps) * w for float32 rows: F.rms_norm's arithmetic (float32 sum).
torch::Tensor rms_norm_cpu(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32,
              "rms_norm: float32 only (other dtypes keep F.rms_norm)");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && x.size(1) == weight.size(0), "rms_norm: x [rows, n], weight [n]");
  const auto xc = x.contiguous();
  const auto wc = weight.contiguous();
  const int64_t rows = xc.size(0), n = xc.size(1);
  auto y = torch::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * n;
      float* yr = yp + r * n;
      const float inv = 1.f / std::sqrt(dot(xr, xr, n) / static_cast<float>(n) + static_cast<float>(eps));
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * wp[i];
    }
  });
  return y;
}
