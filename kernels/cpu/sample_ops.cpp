// A step's draw in one call: among each row's top-k candidates (twin: kernels/reference.py's
// sample_top_k_ref), or over the whole vocabulary (sample_full_ref, its noise hashed here): temperature,
// top-k, top-p, min-p, the noise and the exponential race.
//
// Why: in torch the candidates' draw is ~30 ops (topk, exp, cumsum, masks, the seeded hash's integer
// ops, the race), a few microseconds each at batch 1; at batch 256 over a 512-token vocabulary CPU
// `topk` alone took 1.2 ms of a 3.4 ms step (benchmarks.step_overhead, sampled). Here a row is two
// passes over its logits (a threshold, then the few values that reach it: select_top_k), the
// candidates ordered, and the rest on k values; with top-p, one more pass sums the row's exponentials
// for its whole-vocabulary mass. Over the whole vocabulary torch drew an Exp(1) for every token and
// sorted the vocabulary for top-p (4 ms a row of 49,152); here the noise is hashed where it is needed
// and a nucleus is found among grown candidates, or by bisection when it is large.

#include "ops.h"

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "decode_math.h"

namespace {

struct Cand {
  float v;
  int32_t i;
};

// Best first: the larger logit, and the lower token id on a tie.
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
  const float u = (static_cast<float>(x >> 9) + 0.5f) * (1.0f / 8388608.0f);  // 23 random bits -> (0, 1)
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
// A top-p nucleus larger than this is not sorted: its floor is found by bisection (nucleus_floor).
constexpr int64_t kLargestNucleus = 1024;

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

const float* optional_floats(const char* op, const std::optional<torch::Tensor>& t, int64_t rows, const char* name) {
  if (!t) return nullptr;
  TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->dim() == 1 && t->size(0) == rows && t->is_contiguous(),
              op, ": ", name, " must be a contiguous float32 [rows] tensor");
  return t->data_ptr<float>();
}

const int64_t* optional_longs(const char* op, const std::optional<torch::Tensor>& t, int64_t rows, const char* name) {
  if (!t) return nullptr;
  TORCH_CHECK(t->scalar_type() == torch::kInt64 && t->dim() == 1 && t->size(0) == rows && t->is_contiguous(),
              op, ": ", name, " must be a contiguous int64 [rows] tensor");
  return t->data_ptr<int64_t>();
}

// A draw's inputs, checked (logits float32 [rows, vocab]; one value a row of each parameter given),
// as pointers: null for a parameter not given.
struct DrawArgs {
  int64_t rows, vocab;
  const float* logits;
  const float* temperature;
  const int64_t* top_k;
  const float* top_p;
  const float* min_p;
  const int64_t* seeds;
  const int64_t* index;
};

DrawArgs draw_args(const char* op, const torch::Tensor& logits, const torch::Tensor& temperature,
                   const std::optional<torch::Tensor>& top_k, const std::optional<torch::Tensor>& top_p,
                   const std::optional<torch::Tensor>& min_p, const std::optional<torch::Tensor>& seeds,
                   const std::optional<torch::Tensor>& index) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == torch::kFloat32 && logits.dim() == 2 &&
                  logits.is_contiguous(),
              op, ": logits must be a contiguous float32 [rows, vocab] CPU tensor");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(vocab >= 1 && vocab < (int64_t{1} << 31), op, ": vocabularies of 1 to 2^31 tokens");
  DrawArgs d{rows, vocab, logits.data_ptr<float>(), optional_floats(op, temperature, rows, "temperature"),
             optional_longs(op, top_k, rows, "top_k"), optional_floats(op, top_p, rows, "top_p"),
             optional_floats(op, min_p, rows, "min_p"), optional_longs(op, seeds, rows, "seeds"),
             optional_longs(op, index, rows, "index")};
  TORCH_CHECK((d.seeds == nullptr) == (d.index == nullptr), op, ": seeds and index come together");
  return d;
}

}  // namespace

// Where a row's candidates c[0, count) (sorted, best first) may win and with what weight: e^(v/t - best)
// (v the candidate's logit), 0 where dropped: rank >= keep, v/t below floor, or, with top_p, the mass
// before it (over the whole vocabulary's `mass`) reaching top_p. Then the exponential race: argmax of
// w / noise, the first on a tie; noise hashed from `stream` at the candidates' ids, or q[0, count).
int64_t race_candidates(const Cand* c, int64_t count, float t, float best, int64_t keep, float floor,
                        const float* top_p, float mass, const uint32_t* stream, const float* q, float* w) {
  double cum = 0.0;  // torch's CPU cumsum accumulates float32 in double
  for (int64_t j = 0; j < count; ++j) {
    const float v = c[j].v / t;
    const float wj = std::exp(v - best);
    bool drop = j >= keep || v < floor;
    if (top_p) {
      const float p = wj / mass;
      cum += p;
      // the mass before this candidate reaches top_p (before the best it is 0 < top_p)
      drop = drop || (static_cast<float>(cum) - p) >= *top_p;
    }
    w[j] = drop ? 0.f : wj;
  }
  int64_t choice = 0;
  float top = -1.f;
  for (int64_t j = 0; j < count; ++j) {
    const float score = w[j] / (stream ? seeded_noise_at(*stream, c[j].i) : q[j]);
    if (score > top) {
      top = score;
      choice = j;
    }
  }
  return c[choice].i;
}

#ifdef TESSERA_ATTN_AVX2
// ln x for 8 floats x > 0 (Cephes' logf as avx_mathfun spells it), relative error ~1e-7.
inline __m256 log256(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f);
  x = _mm256_max_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x00800000)));  // no denormals
  __m256i e = _mm256_srli_epi32(_mm256_castps_si256(x), 23);
  x = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(~0x7f800000)));
  x = _mm256_or_ps(x, _mm256_set1_ps(0.5f));
  __m256 ef = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(e, _mm256_set1_epi32(0x7f))), one);
  const __m256 small = _mm256_cmp_ps(x, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OS);
  const __m256 tmp = _mm256_and_ps(x, small);
  x = _mm256_sub_ps(x, one);
  ef = _mm256_sub_ps(ef, _mm256_and_ps(one, small));
  x = _mm256_add_ps(x, tmp);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(7.0376836292E-2f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.1514610310E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.1676998740E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.2420140846E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.4249322787E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.6668057665E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(2.0000714765E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-2.4999993993E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(3.3333331174E-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, x), z);
  y = _mm256_fmadd_ps(ef, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  return _mm256_fmadd_ps(ef, _mm256_set1_ps(0.693359375f), _mm256_add_ps(x, y));
}

// seeded_noise_at for the 8 token ids first .. first + 7.
inline __m256 noise8(uint32_t stream, int64_t first) {
  const __m256i ids = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int32_t>(first)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i x = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int32_t>(stream)),
                               _mm256_mullo_epi32(ids, _mm256_set1_epi32(static_cast<int32_t>(0x9E3779B9u))));
  x = _mm256_mullo_epi32(_mm256_xor_si256(x, _mm256_srli_epi32(x, 16)), _mm256_set1_epi32(static_cast<int32_t>(0x85EBCA6Bu)));
  x = _mm256_mullo_epi32(_mm256_xor_si256(x, _mm256_srli_epi32(x, 13)), _mm256_set1_epi32(static_cast<int32_t>(0xC2B2AE35u)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  const __m256 u = _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 9)), _mm256_set1_ps(0.5f)),
                                 _mm256_set1_ps(1.0f / 8388608.0f));
  return _mm256_sub_ps(_mm256_setzero_ps(), log256(u));
}
#endif

// The race over the whole row: argmax over x[0, n) of e^(x/t - best) / noise(id), hashed noise, tokens
// whose x/t is below floor or whose x is below raw_floor excluded. A hash and a logarithm for every token (vectorized): no Exp(1)
// drawn a token, which in torch was most of a row's 0.8 ms at 49,152 tokens.
int64_t race_all(const float* x, int64_t n, float t, float best, float floor, float raw_floor, uint32_t stream) {
  int64_t i = 0, choice = 0;
  float top = -1.f;
#ifdef TESSERA_ATTN_AVX2
  if (n >= 8) {
    const __m256 tv = _mm256_set1_ps(t), bv = _mm256_set1_ps(best), fv = _mm256_set1_ps(floor);
    const __m256 rv = _mm256_set1_ps(raw_floor);
    __m256 topv = _mm256_set1_ps(-1.f);
    __m256i at = _mm256_setzero_si256();
    for (; i + 8 <= n; i += 8) {
      const __m256 xv = _mm256_loadu_ps(x + i);
      const __m256 v = _mm256_div_ps(xv, tv);
      const __m256 d = _mm256_sub_ps(v, bv);
      // below a floor, or so far below the best that e^d is no normal float: weight 0
      const __m256 out = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(v, fv, _CMP_LT_OQ), _mm256_cmp_ps(xv, rv, _CMP_LT_OQ)),
                                      _mm256_cmp_ps(d, _mm256_set1_ps(-87.f), _CMP_LT_OQ));
      const __m256 w = _mm256_andnot_ps(out, tessera_attn::exp256(d));
      const __m256 score = _mm256_div_ps(w, noise8(stream, i));
      const __m256 wins = _mm256_cmp_ps(score, topv, _CMP_GT_OQ);  // each lane keeps its first maximum
      topv = _mm256_blendv_ps(topv, score, wins);
      at = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(at),
                                                _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(i))), wins));
    }
    alignas(32) float tops[8];
    alignas(32) int32_t starts[8];
    _mm256_store_ps(tops, topv);
    _mm256_store_si256(reinterpret_cast<__m256i*>(starts), at);
    for (int l = 0; l < 8; ++l) {  // the lowest id among the lanes' maxima
      const int64_t id = static_cast<int64_t>(starts[l]) + l;
      if (tops[l] > top || (tops[l] == top && id < choice)) {
        top = tops[l];
        choice = id;
      }
    }
  }
#endif
  for (; i < n; ++i) {
    const float v = x[i] / t;
    const float w = v < floor || x[i] < raw_floor ? 0.f : std::exp(v - best);
    const float score = w / seeded_noise_at(stream, i);
    if (score > top) {
      top = score;
      choice = i;
    }
  }
  return choice;
}

torch::Tensor sample_top_k_cpu(const torch::Tensor& logits, const torch::Tensor& temperature, int64_t k,
                               const std::optional<torch::Tensor>& top_k_t, const std::optional<torch::Tensor>& top_p_t,
                               const std::optional<torch::Tensor>& min_p_t, const torch::Tensor& noise,
                               const std::optional<torch::Tensor>& seeds_t,
                               const std::optional<torch::Tensor>& index_t) {
  const DrawArgs d = draw_args("sample_top_k", logits, temperature, top_k_t, top_p_t, min_p_t, seeds_t, index_t);
  const int64_t rows = d.rows, vocab = d.vocab;
  TORCH_CHECK(k >= 1 && k <= vocab, "sample_top_k: k must be in [1, vocab], got ", k);
  const float* temp = d.temperature;
  const int64_t *top_k = d.top_k, *seeds = d.seeds, *index = d.index;
  const float *top_p = d.top_p, *min_p = d.min_p;
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
      const bool seeded = seeds && seeds[r] >= 0;
      const uint32_t stream = seeded ? noise_stream(seeds[r], index[r]) : 0;
      ids[r] = race_candidates(c.data(), k, t, best, keep, floor, top_p ? top_p + r : nullptr, mass,
                               seeded ? &stream : nullptr, n0 + r * k, w.data());
    }
  });
  return out;
}

// A float's place in the order of floats as an integer (NaN aside), and back.
inline int32_t order_key(float f) {
  int32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b >= 0 ? b : b ^ 0x7fffffff;
}

inline float from_order_key(int64_t k) {
  int32_t b = static_cast<int32_t>(k);
  b = b >= 0 ? b : b ^ 0x7fffffff;
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// The least logit a top-p nucleus keeps when the nucleus is large (a flat row): a token is kept when the
// mass of the tokens above it is below top_p of the whole, so the kept ones are those at or above some
// value; bisection over the value (<= 32 passes of a masked sum over the row's weights, held in `w`)
// instead of a sort of the vocabulary. Ties between equal logits aside, the set the reference's sort keeps.
float nucleus_floor(const float* x, int64_t n, float t, float best, float top_p, std::vector<float>& w) {
  w.resize(n);
  double whole = 0.0;
  float lo = INFINITY, hi = -INFINITY;
  int64_t i = 0;
#ifdef TESSERA_ATTN_AVX2
  const __m256 tv = _mm256_set1_ps(t), bv = _mm256_set1_ps(best);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(w.data() + i, tessera_attn::exp256(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), tv), bv)));
#endif
  for (; i < n; ++i) w[i] = std::exp(x[i] / t - best);
  for (i = 0; i < n; ++i) {
    whole += w[i];
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  const double want = static_cast<double>(top_p) * whole;
  auto above = [&](float v) {  // the mass of the tokens whose logit is above v
    int64_t j = 0;
    double sum = 0.0;
#ifdef TESSERA_ATTN_AVX2
    const __m256 vv = _mm256_set1_ps(v);
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (; j + 16 <= n; j += 16) {
      a = _mm256_add_ps(a, _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), vv, _CMP_GT_OQ), _mm256_loadu_ps(&w[j])));
      b = _mm256_add_ps(b, _mm256_and_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j + 8), vv, _CMP_GT_OQ),
                                         _mm256_loadu_ps(&w[j + 8])));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_add_ps(a, b));
    for (float l : lanes) sum += l;
#endif
    for (; j < n; ++j) sum += x[j] > v ? w[j] : 0.f;
    return sum;
  };
  if (above(lo) < want) return lo;  // every token but the least is above: all kept
  // above(lo) >= want (lo's token is dropped), above(hi) = 0 < want (the best is kept). Bisection over
  // the floats' order (as integers): at most 32 passes, and it ends with no float between lo and hi.
  int64_t klo = order_key(lo), khi = order_key(hi);
  while (khi - klo > 1) {
    const int64_t kmid = klo + (khi - klo) / 2;
    (above(from_order_key(kmid)) < want ? khi : klo) = kmid;
  }
  hi = from_order_key(khi);
  return hi;  // tokens at or above hi have less than top_p above them; those at or below lo do not
}

torch::Tensor sample_full_cpu(const torch::Tensor& logits, const torch::Tensor& temperature,
                              const std::optional<torch::Tensor>& top_k_t, const std::optional<torch::Tensor>& top_p_t,
                              const std::optional<torch::Tensor>& min_p_t, const torch::Tensor& seeds_t,
                              const torch::Tensor& index_t) {
  const DrawArgs d = draw_args("sample_full", logits, temperature, top_k_t, top_p_t, min_p_t, seeds_t, index_t);
  const int64_t rows = d.rows, vocab = d.vocab;
  const float* temp = d.temperature;
  const int64_t *top_k = d.top_k, *seeds = d.seeds, *index = d.index;
  const float *top_p = d.top_p, *min_p = d.min_p;
  auto out = torch::empty({rows}, torch::kInt64);
  const float* x0 = logits.data_ptr<float>();
  int64_t* ids = out.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 32768 / vocab);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<Cand> c;
    std::vector<float> w;
    Scratch scratch;
    for (int64_t r = begin; r < end; ++r) {
      const float* x = x0 + r * vocab;
      const float t = temp[r];
      const uint32_t stream = noise_stream(seeds[r], index[r]);
      const float best = block_max(x, vocab) / t;
      const float floor = min_p && min_p[r] > 0.f ? best + std::log(min_p[r]) : -INFINITY;
      const int64_t keep = top_k && top_k[r] > 0 ? std::min(top_k[r], vocab) : vocab;
      const bool nucleus = top_p && top_p[r] < 1.f;
      if (keep == vocab && !nucleus) {  // every token may win: the race over the row
        ids[r] = race_all(x, vocab, t, best, floor, -INFINITY, stream);
        continue;
      }
      // The candidates the reference's sort keeps are a prefix of the sorted row: the top `count`,
      // grown until it holds top_k or the whole nucleus. Candidates come sorted, so the top m hold at
      // most m / count of the first count's mass: that says how far to grow, and when a nucleus is too
      // large to sort (a flat row) its floor is found by bisection instead.
      const float mass = nucleus ? scaled_mass(x, vocab, t, best) : 1.f;
      int64_t count = nucleus ? std::min<int64_t>(keep, 64) : keep;  // top-k alone: its k
      bool flat = false;
      for (;;) {
        c.resize(count);
        select_top_k(x, vocab, count, c.data(), scratch);
        if (count == keep) break;
        double cum = 0.0;
        for (int64_t j = 0; j < count; ++j) cum += std::exp(c[j].v / t - best) / mass;
        // with a margin over the rounding: the next candidate's mass before reaches top_p, and so do all
        // the others'
        const double need = static_cast<double>(top_p[r]) + 1e-5;
        if (cum >= need) break;
        int64_t next = count * 4;  // at least 4x; more where even that cannot hold top_p
        while (next < vocab && cum * static_cast<double>(next) / static_cast<double>(count) < need) next *= 4;
        if (next > kLargestNucleus && keep == vocab) {
          flat = true;
          break;
        }
        count = std::min(keep, next);
      }
      if (flat) {
        ids[r] = race_all(x, vocab, t, best, floor, nucleus_floor(x, vocab, t, best, top_p[r], w), stream);
        continue;
      }
      w.resize(count);
      ids[r] = race_candidates(c.data(), count, t, best, keep, floor, nucleus ? top_p + r : nullptr, mass, &stream,
                               nullptr, w.data());
    }
  });
  return out;
}
