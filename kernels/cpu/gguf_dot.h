// GGUF Q4_1 / Q8_0 dot products against 8-bit activation blocks: the inner loops shared by
// gguf_matmul.cpp (one projection a call) and gguf_decoder.cpp (a whole decode step a call).
// See gguf_matmul.cpp for the arithmetic and the row layout.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TESSERA_AVX2 1
#endif

namespace tessera_gguf {

constexpr int QK = 32;  // weights per block, both formats

inline float half_to_float(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }

// Activations quantized once per call: plain int8 blocks (Q8_0's order), the same regrouped pair
// by pair for Q4_1 ([b0 0..15 | b1 0..15 | b0 16..31 | b1 16..31], an odd last block as is), and
// per block d_x and s_x, zero-padded to a multiple of 8 blocks.
struct QuantizedRows {
  int64_t rows = 0, k = 0, nb = 0, nb8 = 0;
  std::vector<int8_t> plain, pairs;
  std::vector<float> d, s;
};

inline void quantize_block(const float* x, int8_t* q, float* d_out, float* s_out) {
#ifdef TESSERA_AVX2
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float d = _mm_cvtss_f32(m4) / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  const __m256 mul = _mm256_set1_ps(id);
  __m256i i32[4];
  __m256i sum = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    i32[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    sum = _mm256_add_epi32(sum, i32[i]);
  }
  // int32 -> int8 in order: the packs interleave 128-bit lanes, the permute puts them back.
  const __m256i p01 = _mm256_packs_epi32(i32[0], i32[1]);
  const __m256i p23 = _mm256_packs_epi32(i32[2], i32[3]);
  const __m256i p = _mm256_packs_epi16(p01, p23);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_hadd_epi32(s4, s4);
  s4 = _mm_hadd_epi32(s4, s4);
  *d_out = d;
  *s_out = d * static_cast<float>(_mm_cvtsi128_si32(s4));
#else
  float amax = 0.f;
  for (int i = 0; i < QK; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float d = amax / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  int sum = 0;
  for (int i = 0; i < QK; ++i) {
    const int v = static_cast<int>(std::nearbyint(x[i] * id));
    q[i] = static_cast<int8_t>(v);
    sum += v;
  }
  *d_out = d;
  *s_out = d * static_cast<float>(sum);
#endif
}

inline void quantize_rows(const float* x, int64_t rows, int64_t k, bool pairs, QuantizedRows& out) {
  out.rows = rows;
  out.k = k;
  out.nb = k / QK;
  out.nb8 = (out.nb + 7) / 8 * 8;
  out.plain.resize(static_cast<size_t>(rows * k));
  out.d.assign(static_cast<size_t>(rows * out.nb8), 0.f);
  out.s.assign(static_cast<size_t>(rows * out.nb8), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < out.nb; ++b) {
      quantize_block(x + r * k + b * QK, out.plain.data() + r * k + b * QK, &out.d[r * out.nb8 + b],
                     &out.s[r * out.nb8 + b]);
    }
  }
  if (!pairs) return;
  out.pairs.resize(out.plain.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* src = out.plain.data() + r * k;
    int8_t* dst = out.pairs.data() + r * k;
    int64_t b = 0;
    for (; b + 1 < out.nb; b += 2) {
      std::memcpy(dst + b * QK, src + b * QK, 16);
      std::memcpy(dst + b * QK + 16, src + (b + 1) * QK, 16);
      std::memcpy(dst + b * QK + 32, src + b * QK + 16, 16);
      std::memcpy(dst + b * QK + 48, src + (b + 1) * QK + 16, 16);
    }
    if (b < out.nb) std::memcpy(dst + b * QK, src + b * QK, QK);
  }
}

// Eight fp16 values from p (fewer when `count` < 8: the rest read as zero).
#ifdef TESSERA_AVX2
// The tail (a row's last group of fewer than 8 blocks) is a masked load: 32-bit words that hold the
// `count` halves (never touching memory past them, so never past the tensor's end), then the odd
// half beyond `count` cleared. A copy through a zeroed stack buffer here made K = 576 rows (18 blocks:
// a tail of 2 in every row) stream at 29 GB/s against 55 for K = 1536 (AVX-512 BF16 EPYC, 2 threads).
inline __m256 load_halves(const uint8_t* p, int64_t count) {
  if (count >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const int n = static_cast<int>(count);
  const __m128i words = _mm_cmpgt_epi32(_mm_set1_epi32((n + 1) / 2), _mm_setr_epi32(0, 1, 2, 3));
  const __m128i halves = _mm_cmpgt_epi16(_mm_set1_epi16(static_cast<int16_t>(n)), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
  const __m128i v = _mm_maskload_epi32(reinterpret_cast<const int*>(p), words);
  return _mm256_cvtph_ps(_mm_and_si128(v, halves));
}

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// 8 int32 lanes of pairwise q_w * q_x sums as float; |pair sums| <= 2 * 127 * 127: no saturation.
inline __m256 sum_u8_i8(__m256i w, __m256i x) {
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
#endif

// ROWS rows of Q4_1 (kernel layout) against one quantized activation row: out[0 .. ROWS).
template <int ROWS>
void dot_q4_1(const uint8_t* const* rows, const QuantizedRows& xq, int64_t r, float* out) {
  const int64_t nb = xq.nb;
  const float* xd = xq.d.data() + r * xq.nb8;
  const float* xs = xq.s.data() + r * xq.nb8;
#ifdef TESSERA_AVX2
  const int8_t* xp = xq.pairs.data() + r * xq.k;
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[ROWS], mins[ROWS];
  for (int i = 0; i < ROWS; ++i) acc[i] = mins[i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < nb; g += 8) {
    const int64_t count = std::min<int64_t>(8, nb - g);
    const __m256 dx = _mm256_loadu_ps(xd + g), sx = _mm256_loadu_ps(xs + g);
    __m256 scale[ROWS];
    for (int i = 0; i < ROWS; ++i) {
      scale[i] = _mm256_mul_ps(load_halves(rows[i] + nb * 16 + g * 2, count), dx);
      mins[i] = _mm256_fmadd_ps(load_halves(rows[i] + nb * 18 + g * 2, count), sx, mins[i]);
    }
    int64_t j = 0;
    for (; j + 1 < count; j += 2) {
      const __m256i xlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + (g + j) * QK));
      const __m256i xhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + (g + j) * QK + 32));
      const __m256i lanes = _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1);
      for (int i = 0; i < ROWS; ++i) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + (g + j) * 16));
        const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(w, low), xlo),
                                             _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), low), xhi));
        const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        acc[i] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scale[i], lanes), f, acc[i]);
      }
    }
    if (j < count) {  // the odd last block of the row, in plain order
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + (g + j) * QK));
      const __m256i lanes = _mm256_set1_epi32(static_cast<int>(j));
      for (int i = 0; i < ROWS; ++i) {
        const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + (g + j) * 16));
        const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), low);
        acc[i] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scale[i], lanes), sum_u8_i8(w, x), acc[i]);
      }
    }
  }
  for (int i = 0; i < ROWS; ++i) out[i] = hsum(acc[i]) + hsum(mins[i]);
#else
  const int8_t* x = xq.plain.data() + r * xq.k;
  for (int i = 0; i < ROWS; ++i) {
    const uint8_t* row = rows[i];
    uint16_t hd, hm;
    float total = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      int sum = 0;
      for (int e = 0; e < 16; ++e) {
        const uint8_t byte = row[b * 16 + e];
        sum += (byte & 0x0F) * x[b * QK + e] + (byte >> 4) * x[b * QK + 16 + e];
      }
      std::memcpy(&hd, row + nb * 16 + b * 2, 2);
      std::memcpy(&hm, row + nb * 18 + b * 2, 2);
      total += half_to_float(hd) * xd[b] * static_cast<float>(sum) + half_to_float(hm) * xs[b];
    }
    out[i] = total;
  }
#endif
}

// ROWS rows of Q8_0 (kernel layout) against one quantized activation row.
template <int ROWS>
void dot_q8_0(const uint8_t* const* rows, const QuantizedRows& xq, int64_t r, float* out) {
  const int64_t nb = xq.nb;
  const float* xd = xq.d.data() + r * xq.nb8;
  const int8_t* x = xq.plain.data() + r * xq.k;
#ifdef TESSERA_AVX2
  __m256 acc[ROWS];
  for (int i = 0; i < ROWS; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < nb; g += 8) {
    const int64_t count = std::min<int64_t>(8, nb - g);
    const __m256 dx = _mm256_loadu_ps(xd + g);
    __m256 scale[ROWS];
    for (int i = 0; i < ROWS; ++i) scale[i] = _mm256_mul_ps(load_halves(rows[i] + nb * QK + g * 2, count), dx);
    for (int64_t j = 0; j < count; ++j) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + (g + j) * QK));
      const __m256i lanes = _mm256_set1_epi32(static_cast<int>(j));
      for (int i = 0; i < ROWS; ++i) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + (g + j) * QK));
        // maddubs wants one unsigned side: |w| times x carrying w's sign.
        const __m256 f = sum_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
        acc[i] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scale[i], lanes), f, acc[i]);
      }
    }
  }
  for (int i = 0; i < ROWS; ++i) out[i] = hsum(acc[i]);
#else
  for (int i = 0; i < ROWS; ++i) {
    const int8_t* w = reinterpret_cast<const int8_t*>(rows[i]);
    uint16_t hd;
    float total = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      int sum = 0;
      for (int e = 0; e < QK; ++e) sum += w[b * QK + e] * x[b * QK + e];
      std::memcpy(&hd, rows[i] + nb * QK + b * 2, 2);
      total += half_to_float(hd) * xd[b] * static_cast<float>(sum);
    }
    out[i] = total;
  }
#endif
}

// --- row groups of one projection: what gguf_matmul.cpp and gguf_decoder.cpp both loop over ---

// One projection's blocks: rows of `row_bytes` in kernels/gguf_layout.py's layout.
// Weight rows computed side by side: independent accumulator chains, one activation load for all.
constexpr int ROWS = 4;
// Row groups prefetched ahead, into L2 while a group computes: streaming the 49152 x 576 Q8_0 head
// at batch 1 (AVX2 EPYC, 2 threads) went from 2.2-2.7 ms to 0.87-0.91 ms; four ahead was no better.
constexpr int64_t PREFETCH_AHEAD = 2;

struct Proj {
  const uint8_t* w = nullptr;
  int64_t out = 0, in = 0, row_bytes = 0;
  bool q4_1 = true;
};

// Rows [n0, n0 + ROWS) of p (those that exist) towards L2. Written without an early `if`: GCC 12
// at -O1 and above dropped the whole prefetch when it was guarded by `n0 + ROWS <= p.out`, and
// every projection of the fused step then streamed at a third of the per-op kernel's speed.
inline void prefetch_rows(const Proj& p, int64_t n0) {
#ifdef TESSERA_AVX2
  const int64_t bytes = std::min<int64_t>(ROWS, p.out - n0) * p.row_bytes;
  const char* ahead = reinterpret_cast<const char*>(p.w + n0 * p.row_bytes);
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T1);
#else
  (void)p;
  (void)n0;
#endif
}

inline void dot_rows(const Proj& p, const uint8_t* const* rows, const QuantizedRows& xq, int64_t r, float* res) {
  if (p.q4_1) {
    dot_q4_1<ROWS>(rows, xq, r, res);
  } else {
    dot_q8_0<ROWS>(rows, xq, r, res);
  }
}

// The rows of group n0 from `base` on; past `last` the group repeats it (computed, not stored).
inline void row_pointers(const Proj& p, int64_t base, int64_t last, int64_t n0, const uint8_t** rows) {
  for (int i = 0; i < ROWS; ++i) rows[i] = p.w + (base + std::min(n0 + i, last)) * p.row_bytes;
}

// Row groups [g0, g1) of p's rows from `base` on (up to p.out) against the quantized rows xq:
// store(r, n, value) for each output n counted from `base`.
template <typename Store>
void project_from(const Proj& p, int64_t base, const QuantizedRows& xq, int64_t g0, int64_t g1, Store&& store) {
  float res[ROWS];
  const uint8_t* rows[ROWS];
  const int64_t count = p.out - base;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t n0 = g * ROWS;
    if (g + PREFETCH_AHEAD < g1) prefetch_rows(p, base + n0 + PREFETCH_AHEAD * ROWS);
    row_pointers(p, base, count - 1, n0, rows);
    for (int64_t r = 0; r < xq.rows; ++r) {
      dot_rows(p, rows, xq, r, res);
      for (int i = 0; i < ROWS && n0 + i < count; ++i) store(r, n0 + i, res[i]);
    }
  }
}

template <typename Store>
void project(const Proj& p, const QuantizedRows& xq, int64_t g0, int64_t g1, Store&& store) {
  project_from(p, 0, xq, g0, g1, store);
}

}  // namespace tessera_gguf
