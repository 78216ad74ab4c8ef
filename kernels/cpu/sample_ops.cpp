// A step's draw among each row's top-k candidates in one call: top-k, temperature, top-p, min-p,
// seeded noise and the exponential race. Twin: kernels/reference.py's sample_top_k_ref.
//
// Why: in torch the draw is ~30 ops (topk, exp, cumsum, masks, the seeded hash's integer ops, the
// race), a few microseconds each at batch 1; at batch 256 over a 512-token vocabulary CPU `topk`
// alone took 1.2 ms of a 3.4 ms step (benchmarks.step_overhead, sampled). Here a row is two passes
// over its logits (a threshold, then the few values that reach it: select_top_k), the candidates
// sorted, and the rest on k values. With top-p, one more pass sums
// the row's exponentials for its whole-vocabulary mass.

#include "ops.h"

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "decode_math.h"

namespace {

struct Cand {
  float v;
  int32_t i;
};

// Best first: the larger logit, and the lower token id on a tie. As a heap's comparator the front is
// the worst kept candidate.
inline bool better(const Cand& a, const Cand& b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }

// kernels/seeded_noise.py's hash, the same integer arithmetic (torch's signed ops wrap as these do).
inline uint32_t noise_stream(int64_t seed, int64_t index) {
  uint64_t x = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x = x ^ (x >> 31);
  return static_cast<uint32_t>(x);
}

inline float seeded_noise_at(uint32_t stream, int64_t id) {
  uint32_t x = stream ^ (static_cast<uint32_t>(id) * 0x9E3779B9u);
  x = (x ^ (x >> 16)) * 0x85EBCA6Bu;
  x = (x ^ (x >> 13)) * 0xC2B2AE35u;
  x = x ^ (x >> 16);
  const float u = (static_cast<float>(x >> 8) + 0.5f) * (1.0f / 16777216.0f);  // 24 random bits -> (0, 1)
  return -std::log(u);
}

// whether any of p[0, n) (n <= 16) is >= t
inline bool reaches(const float* p, int64_t n, float t) {
#ifdef TESSERA_ATTN_AVX2
  if (n == 16) {
    const __m256 tv = _mm256_set1_ps(t);
    const __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(p), tv, _CMP_GE_OQ);
    const __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(p + 8), tv, _CMP_GE_OQ);
    return _mm256_movemask_ps(_mm256_or_ps(a, b)) != 0;
  }
#endif
  bool any = false;
  for (int64_t j = 0; j < n; ++j) any |= p[j] >= t;
  return any;
}

// Up to this many candidates are ordered by counting (m^2 compares, branch-free and vectorized); more
// (a row masked to fewer than k numbers, say) by the standard library's branchy selection and sort.
constexpr int64_t kRankLimit = 256;

struct Scratch {
  std::vector<float> maxima, pv;  // the piles' maxima; the pool's values
  std::vector<int32_t> pi;        // the pool's token ids
  std::vector<Cand> sorted;       // a pool too large to rank
};

// max of p[0, n), -inf for none; a NaN never wins. Lanes kept apart so that the loop vectorizes (a
// float max reduction is not reassociated without -ffast-math: one dependent max a value otherwise).
inline float block_max(const float* p, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lane[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lane[l] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = p[i + l] > lane[l] ? p[i + l] : lane[l];
  float m = -INFINITY;
  for (int64_t l = 0; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  for (; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

// The k best of x[0, n), sorted best first, into c (k <= n). A threshold first: the row's values
// split into about 2k piles and the k-th largest of the piles' maxima; at least k values reach it
// (those k maxima), and on a model's logits not many more (~50 for k = 40 of 512, ~k of 49k). Only
// those are collected, and each placed at its rank, counted. A NaN never reaches a threshold: it
// ranks after -inf. Piles are contiguous blocks where a block holds 16 values or more (each max one
// vectorized loop); on a short row the values are dealt round-robin (pile j holds x[j], x[j + P], ...:
// one vectorized max a row of P), since blocks of a few values would be a scalar max each.
// Where the time went: branches. With std::sort over the collected values a row of 512 took ~3 us
// on fresh logits each call (half that when the same logits came back: the branch predictor
// remembers a benchmark's repeated inputs, never a model's).
void select_top_k(const float* x, int64_t n, int64_t k, Cand* c, Scratch& s) {
  int64_t piles;
  const int64_t b = n / (2 * k);
  if (b >= 16) {
    piles = (n + b - 1) / b;  // >= 2k
    s.maxima.resize(piles);
    for (int64_t j = 0; j < piles; ++j) s.maxima[j] = block_max(x + j * b, std::min(b, n - j * b));
  } else {
    piles = std::min(n, 2 * k);  // >= k
    s.maxima.assign(piles, -INFINITY);
    float* mx = s.maxima.data();
    for (int64_t r = 0; r < n; r += piles) {
      const float* row = x + r;
      const int64_t len = std::min(piles, n - r);
      for (int64_t j = 0; j < len; ++j) mx[j] = row[j] > mx[j] ? row[j] : mx[j];  // a NaN never wins
    }
  }
  float* mx = s.maxima.data();
  std::nth_element(mx, mx + (k - 1), mx + piles, std::greater<float>());
  const float t = mx[k - 1];
  s.pv.resize(n + 16);
  s.pi.resize(n + 16);
  float* pv = s.pv.data();
  int32_t* pi = s.pi.data();
  int64_t m = 0;
  constexpr int64_t kBlock = 16;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t end = std::min(i + kBlock, n);
    if (!reaches(x + i, end - i, t)) continue;  // most blocks of a long row have none
    for (int64_t j = i; j < end; ++j) {  // no branch to mispredict: write, keep it where it reached t
      pv[m] = x[j];
      pi[m] = static_cast<int32_t>(j);
      m += x[j] >= t;
    }
  }
  for (int64_t i = 0; m < k && i < n; ++i) {  // NaNs (t is -inf when fewer than k values are numbers)
    if (!(x[i] >= t)) {
      pv[m] = -INFINITY;
      pi[m++] = static_cast<int32_t>(i);
    }
  }
  if (m > kRankLimit) {
    s.sorted.resize(m);
    for (int64_t j = 0; j < m; ++j) s.sorted[j] = {pv[j], pi[j]};
    std::nth_element(s.sorted.begin(), s.sorted.begin() + (k - 1), s.sorted.end(), better);
    std::sort(s.sorted.begin(), s.sorted.begin() + k, better);
    std::copy(s.sorted.begin(), s.sorted.begin() + k, c);
    return;
  }
  for (int64_t j = 0; j < m; ++j) {  // a value's rank: how many are better (larger; equal, a lower id)
    const float v = pv[j];
    const int32_t id = pi[j];
    int32_t rank = 0;
    for (int64_t i = 0; i < m; ++i) rank += (pv[i] > v) | ((pv[i] == v) & (pi[i] < id));
    if (rank < k) c[rank] = {v, id};
  }
}

// sum over x[0, n) of e^(x / t - best), the row's whole mass relative to its best scaled logit.
float scaled_mass(const float* x, int64_t n, float t, float best) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef TESSERA_ATTN_AVX2
  __m256 acc = _mm256_setzero_ps();
  // x * (1 / t) rather than x / t: a sum, so the last bit of each term does not matter; a division
  // costs as much as the exponential
  const __m256 inv = _mm256_set1_ps(1.f / t), bv = _mm256_set1_ps(best);
  for (; i + 8 <= n; i += 8)
    acc = _mm256_add_ps(acc, tessera_attn::exp256(_mm256_fmsub_ps(_mm256_loadu_ps(x + i), inv, bv)));
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  sum = _mm_cvtss_f32(lo);
#endif
  for (; i < n; ++i) sum += std::exp(x[i] / t - best);
  return sum;
}

const float* optional_floats(const std::optional<torch::Tensor>& t, int64_t rows, const char* name) {
  if (!t) return nullptr;
  TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->dim() == 1 && t->size(0) == rows && t->is_contiguous(),
              "sample_top_k: ", name, " must be a contiguous float32 [rows] tensor");
  return t->data_ptr<float>();
}

const int64_t* optional_longs(const std::optional<torch::Tensor>& t, int64_t rows, const char* name) {
  if (!t) return nullptr;
  TORCH_CHECK(t->scalar_type() == torch::kInt64 && t->dim() == 1 && t->size(0) == rows && t->is_contiguous(),
              "sample_top_k: ", name, " must be a contiguous int64 [rows] tensor");
  return t->data_ptr<int64_t>();
}

}  // namespace

torch::Tensor sample_top_k_cpu(const torch::Tensor& logits, const torch::Tensor& temperature, int64_t k,
                               const std::optional<torch::Tensor>& top_k_t, const std::optional<torch::Tensor>& top_p_t,
                               const std::optional<torch::Tensor>& min_p_t, const torch::Tensor& noise,
                               const std::optional<torch::Tensor>& seeds_t,
                               const std::optional<torch::Tensor>& index_t) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == torch::kFloat32 && logits.dim() == 2 &&
                  logits.is_contiguous(),
              "sample_top_k: logits must be a contiguous float32 [rows, vocab] CPU tensor");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(k >= 1 && k <= vocab, "sample_top_k: k must be in [1, vocab], got ", k);
  TORCH_CHECK(vocab < (int64_t{1} << 31), "sample_top_k: vocabularies up to 2^31 tokens");
  const float* temp = optional_floats(temperature, rows, "temperature");
  const int64_t* top_k = optional_longs(top_k_t, rows, "top_k");
  const float* top_p = optional_floats(top_p_t, rows, "top_p");
  const float* min_p = optional_floats(min_p_t, rows, "min_p");
  const int64_t* seeds = optional_longs(seeds_t, rows, "seeds");
  const int64_t* index = optional_longs(index_t, rows, "index");
  TORCH_CHECK((seeds == nullptr) == (index == nullptr), "sample_top_k: seeds and index come together");
  TORCH_CHECK(noise.scalar_type() == torch::kFloat32 && noise.dim() == 2 && noise.size(0) == rows &&
                  noise.size(1) == k && noise.is_contiguous(),
              "sample_top_k: noise must be a contiguous float32 [rows, k] tensor");
  auto out = torch::empty({rows}, torch::kInt64);
  const float* x0 = logits.data_ptr<float>();
  const float* n0 = noise.data_ptr<float>();
  int64_t* ids = out.data_ptr<int64_t>();
  // a chunk of rows is ~32k logits read: one OpenMP region pays for itself
  const int64_t grain = std::max<int64_t>(1, 32768 / vocab);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<Cand> c(k);
    std::vector<float> w(k);
    Scratch scratch;
    for (int64_t r = begin; r < end; ++r) {
      const float* x = x0 + r * vocab;
      const float t = temp[r];
      select_top_k(x, vocab, k, c.data(), scratch);
      const float best = c[0].v / t;
      const int64_t keep = top_k ? std::min(top_k[r], k) : k;
      const float floor = min_p ? best + std::log(min_p[r]) : -INFINITY;
      const float mass = top_p ? scaled_mass(x, vocab, t, best) : 1.f;
      double cum = 0.0;  // torch's CPU cumsum accumulates float32 in double
      for (int64_t j = 0; j < k; ++j) {
        const float v = c[j].v / t;
        float wj = std::exp(v - best);
        bool drop = j >= keep || v < floor;
        if (top_p) {
          const float p = wj / mass;
          cum += p;
          // the mass before this candidate reaches top_p (before the best it is 0 < top_p)
          drop = drop || (static_cast<float>(cum) - p) >= top_p[r];
        }
        w[j] = drop ? 0.f : wj;
      }
      const bool seeded = seeds && seeds[r] >= 0;
      const uint32_t stream = seeded ? noise_stream(seeds[r], index[r]) : 0;
      int64_t choice = 0;
      float top = -1.f;
      for (int64_t j = 0; j < k; ++j) {  // the exponential race: argmax of w / Exp(1), the first on a tie
        const float q = seeded ? seeded_noise_at(stream, c[j].i) : n0[r * k + j];
        const float score = w[j] / q;
        if (score > top) {
          top = score;
          choice = j;
        }
      }
      ids[r] = c[choice].i;
    }
  });
  return out;
}
