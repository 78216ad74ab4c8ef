// A whole decode step of a Llama decoder whose projections stay in GGUF's Q4_1 / Q8_0 blocks, as
// one call: every layer's RMSNorm, q/k/v, rotary, KV-cache write, paged attention, o projection,
// SwiGLU MLP and both residual adds, for a few decode rows at once (decode-only steps).
//
// Why: with 4-bit weights a batch-1 step of SmolLM2-135M streams ~96 MB, 2 ms at this machine's
// bandwidth, but the step took 6.4 ms one projection or op at a time (AVX-512 BF16 EPYC, 2
// threads): 30 layers x ~12 Python calls, each a dispatch, an allocation and an OpenMP region
// whose threads had gone to sleep in between. Here the threads enter one parallel region per
// step and meet at four barriers a layer; activations stay float32 in buffers this object
// keeps. llama.cpp runs its graph the same way (one thread pool, a barrier between nodes).
//
// Work split: each projection's rows are cut into one contiguous range per thread (weights
// stream once, no thread reads another's); the norm and 8-bit quantization of the activations
// that a projection reads are recomputed by every thread (a few hundred values: cheaper than a
// barrier); attention runs one task per (sequence, KV head). The gate and up rows of the fused
// gate_up projection are computed side by side so SwiGLU is applied as they come out.
//
// Twin: the per-op path of dataplane/models/llama.py (GgufLinear, rope_write_kv, the C++ decode
// attention, RMSNorm) computes the same; tests/kernels/test_gguf_decoder.py holds them together.

#include "ops.h"

#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "decode_math.h"
#include "gguf_dot.h"

namespace {

using tessera_gguf::Proj;
using tessera_gguf::project;
using tessera_gguf::project_from;
using tessera_gguf::QuantizedRows;
using tessera_gguf::quantize_rows;
using tessera_gguf::ROWS;

// gate[i] = silu(gate[i]) * up[i] = gate / (1 + e^-gate) * up.
inline void swiglu(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
#ifdef TESSERA_ATTN_AVX2
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = tessera_attn::exp256(_mm256_xor_ps(g, sign));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) gate[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

inline std::pair<int64_t, int64_t> share(int64_t total, int t, int threads) {
  return {total * t / threads, total * (t + 1) / threads};
}

// y = x / sqrt(mean(x^2) + eps) * w, float32 (F.rms_norm's arithmetic).
inline void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float inv = 1.f / std::sqrt(tessera_attn::dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

struct Scratch {  // one thread's buffers
  std::vector<float> x;  // normed activations (rows x width) before quantization
  QuantizedRows xq;
  std::vector<float> q, scores, acc;  // attention: a task's rotated queries, scores, output
  std::vector<float> k;  // an FP8 cache's rotated key row, before it is quantized
};

class GgufDecoder {
 public:
  GgufDecoder(std::vector<torch::Tensor> projections, std::vector<int64_t> formats,
              std::vector<torch::Tensor> input_norms, std::vector<torch::Tensor> post_norms, torch::Tensor cos_sin,
              int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale)
      : heads_(heads), kv_heads_(kv_heads), d_(head_dim), eps_(static_cast<float>(eps)),
        scale_(static_cast<float>(scale)) {
    const int64_t layers = static_cast<int64_t>(input_norms.size());
    TORCH_CHECK(layers > 0 && post_norms.size() == input_norms.size() &&
                    projections.size() == static_cast<size_t>(4 * layers) && formats.size() == projections.size(),
                "GgufDecoder: per layer one input norm, one post norm, and four projections (qkv, o, gate_up, down) "
                "with a format each");
    TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 && head_dim % 2 == 0,
                "GgufDecoder: head counts must divide and head_dim be even");
    hidden_ = input_norms[0].numel();
    TORCH_CHECK(cos_sin.scalar_type() == torch::kFloat32 && cos_sin.is_contiguous() && cos_sin.dim() == 3 &&
                    cos_sin.size(1) == head_dim / 2 && cos_sin.size(2) == 2,
                "GgufDecoder: cos_sin must be a contiguous float32 [max_pos, head_dim / 2, 2]");
    cos_sin_ = cos_sin;
    const int64_t qkv_out = (heads + 2 * kv_heads) * head_dim;
    for (int64_t l = 0; l < layers; ++l) {
      for (auto* norms : {&input_norms, &post_norms}) {
        TORCH_CHECK((*norms)[l].dim() == 1 && (*norms)[l].numel() == hidden_, "GgufDecoder: layer ", l,
                    " norm weight must be [", hidden_, "]");
      }
      norms_.push_back(input_norms[l].to(torch::kFloat32).contiguous());
      norms_.push_back(post_norms[l].to(torch::kFloat32).contiguous());
      for (int64_t j = 0; j < 4; ++j) {
        const torch::Tensor& b = projections[l * 4 + j];
        const bool q4 = formats[l * 4 + j] == 1;
        TORCH_CHECK(formats[l * 4 + j] == 0 || q4, "GgufDecoder: format 1 (Q4_1) or 0 (Q8_0)");
        TORCH_CHECK(b.scalar_type() == torch::kUInt8 && b.dim() == 2 && b.is_contiguous() && b.device().is_cpu(),
                    "GgufDecoder: projections must be contiguous uint8 CPU blocks");
        const int64_t row_bytes = b.size(1);
        const int64_t per_block = q4 ? 20 : 34;
        TORCH_CHECK(row_bytes % per_block == 0, "GgufDecoder: layer ", l, " projection ", j, " rows of ", row_bytes,
                    " bytes are not whole blocks");
        Proj p{b.data_ptr<uint8_t>(), b.size(0), row_bytes / per_block * 32, row_bytes, q4};
        const int64_t want_in = j == 1 ? heads * head_dim : j == 3 ? p.in : hidden_;
        TORCH_CHECK(p.in == want_in, "GgufDecoder: layer ", l, " projection ", j, " takes ", p.in, " inputs, not ",
                    want_in);
        if (j == 0) TORCH_CHECK(p.out == qkv_out, "GgufDecoder: layer ", l, " qkv has ", p.out, " rows, not ", qkv_out);
        if (j == 1 || j == 3) TORCH_CHECK(p.out == hidden_, "GgufDecoder: layer ", l, " projection ", j, " has ",
                                           p.out, " rows, not ", hidden_);
        if (j == 2) {
          TORCH_CHECK(p.out % 2 == 0, "GgufDecoder: gate_up must have an even number of rows");
          intermediate_ = p.out / 2;
        }
        if (j == 3) TORCH_CHECK(p.in == intermediate_, "GgufDecoder: layer ", l, " down takes ", p.in,
                                " inputs, not the ", intermediate_, " of gate_up");
        projs_.push_back(p);
      }
    }
    blocks_ = std::move(projections);  // keeps the weights alive
  }

  torch::Tensor forward(const torch::Tensor& h_in, const torch::Tensor& positions, const torch::Tensor& slots,
                        const torch::Tensor& block_tables, const torch::Tensor& context_lens,
                        const std::vector<torch::Tensor>& key_caches, const std::vector<torch::Tensor>& value_caches) {
    // The step buffers are this object's: a second caller (two engines sharing one loaded model, the
    // GIL released) waits for the first rather than writing into its activations.
    std::lock_guard<std::mutex> guard(mutex_);
    const int64_t layers = static_cast<int64_t>(norms_.size() / 2);
    TORCH_CHECK(h_in.dim() == 2 && h_in.size(1) == hidden_, "GgufDecoder: h must be [rows, ", hidden_, "]");
    const int64_t m = h_in.size(0);
    TORCH_CHECK(positions.numel() == m && slots.numel() == m && context_lens.numel() == m &&
                    block_tables.dim() == 2 && block_tables.size(0) == m,
                "GgufDecoder: one position, slot, length and block table row per row of h");
    TORCH_CHECK(static_cast<int64_t>(key_caches.size()) == layers && value_caches.size() == key_caches.size(),
                "GgufDecoder: one key and one value cache per layer");
    const auto dtype = key_caches[0].scalar_type();
    TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16 || dtype == torch::kByte,
                "GgufDecoder: float32 or bfloat16 caches, or FP8 ones (uint8 rows, kernels/kv_fp8.py)");
    const int64_t row = dtype == torch::kByte ? d_ + tessera_attn::kScaleElems<tessera_attn::Fp8> : d_;
    for (int64_t l = 0; l < layers; ++l) {
      for (const auto* c : {&key_caches[l], &value_caches[l]}) {
        TORCH_CHECK(c->scalar_type() == dtype && c->is_contiguous() && c->dim() == 4 &&
                        c->sizes() == key_caches[0].sizes() && c->size(2) == kv_heads_ && c->size(3) == row,
                    "GgufDecoder: caches must be contiguous [blocks, block_size, kv_heads, head_dim (+ 2 for FP8)], "
                    "one dtype");
      }
    }
    const int64_t num_blocks = key_caches[0].size(0), block_size = key_caches[0].size(1);
    const auto pos = positions.to(torch::kInt64).contiguous();
    const auto sl = slots.to(torch::kInt64).contiguous();
    const auto tables = block_tables.to(torch::kInt64).contiguous();
    const auto lens = context_lens.to(torch::kInt64).contiguous();
    const int64_t* pp = pos.data_ptr<int64_t>();
    const int64_t* sp = sl.data_ptr<int64_t>();
    const int64_t* tp = tables.data_ptr<int64_t>();
    const int64_t* lp = lens.data_ptr<int64_t>();
    const int64_t width = tables.size(1);
    // Everything the parallel region reads is checked here: nothing may throw inside it.
    for (int64_t r = 0; r < m; ++r) {
      TORCH_CHECK(pp[r] >= 0 && pp[r] < cos_sin_.size(0), "GgufDecoder: position ", pp[r], " beyond the table");
      TORCH_CHECK(sp[r] >= 0 && sp[r] < num_blocks * block_size, "GgufDecoder: slot ", sp[r], " out of range");
      TORCH_CHECK(lp[r] >= 1 && lp[r] <= width * block_size, "GgufDecoder: context length ", lp[r], " does not fit ",
                  width, " blocks");
      for (int64_t b = 0; b < (lp[r] + block_size - 1) / block_size; ++b) {
        TORCH_CHECK(tp[r * width + b] >= 0 && tp[r * width + b] < num_blocks, "GgufDecoder: block id ",
                    tp[r * width + b], " out of range");
      }
    }
    torch::Tensor hf = h_in.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true).contiguous();  // updated in place
    const int64_t qkv_out = (heads_ + 2 * kv_heads_) * d_;
    qkv_.resize(static_cast<size_t>(m * qkv_out));
    attn_.resize(static_cast<size_t>(m * heads_ * d_));
    act_.resize(static_cast<size_t>(m * intermediate_));
    up_.resize(static_cast<size_t>(m * intermediate_));
    const int nt = std::max(1, at::get_num_threads());
    if (scratch_.size() < static_cast<size_t>(nt)) scratch_.resize(static_cast<size_t>(nt));
    std::vector<float*> kp(layers), vp(layers);
    std::vector<c10::BFloat16*> kb(layers), vb(layers);
    std::vector<tessera_attn::Fp8*> k8(layers), v8(layers);
    for (int64_t l = 0; l < layers; ++l) {
      if (dtype == torch::kByte) {
        k8[l] = reinterpret_cast<tessera_attn::Fp8*>(key_caches[l].data_ptr<uint8_t>());
        v8[l] = reinterpret_cast<tessera_attn::Fp8*>(value_caches[l].data_ptr<uint8_t>());
      } else if (dtype == torch::kFloat32) {
        kp[l] = key_caches[l].data_ptr<float>();
        vp[l] = value_caches[l].data_ptr<float>();
      } else {
        kb[l] = key_caches[l].data_ptr<c10::BFloat16>();
        vb[l] = value_caches[l].data_ptr<c10::BFloat16>();
      }
    }
    float* h = hf.data_ptr<float>();
    const Args args{m, pp, sp, tp, width, lp, num_blocks, block_size};
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num(), threads = omp_get_num_threads();
      Scratch& sc = scratch_[static_cast<size_t>(t)];
      for (int64_t l = 0; l < layers; ++l) {
        if (dtype == torch::kByte) {
          layer(l, h, k8[l], v8[l], args, t, threads, sc);
        } else if (dtype == torch::kFloat32) {
          layer(l, h, kp[l], vp[l], args, t, threads, sc);
        } else {
          layer(l, h, kb[l], vb[l], args, t, threads, sc);
        }
      }
    }
    return h_in.scalar_type() == torch::kFloat32 ? hf : hf.to(h_in.scalar_type());
  }

 private:
  struct Args {
    int64_t m;
    const int64_t *positions, *slots, *tables;
    int64_t width;
    const int64_t* lens;
    int64_t num_blocks, block_size;
  };

  // Norm then quantize rows x [m, n] (each thread its own copy: no barrier).
  void norm_quantize(const float* x, const float* w, int64_t m, int64_t n, bool pairs, Scratch& sc) const {
    sc.x.resize(static_cast<size_t>(m * n));
    for (int64_t r = 0; r < m; ++r) rms_norm_row(x + r * n, w, sc.x.data() + r * n, n, eps_);
    quantize_rows(sc.x.data(), m, n, pairs, sc.xq);
  }

  template <typename T>
  void layer(int64_t l, float* h, T* kc, T* vc, const Args& a, int t, int threads, Scratch& sc) {
    const Proj &qkv = projs_[l * 4], &o = projs_[l * 4 + 1], &gate_up = projs_[l * 4 + 2], &down = projs_[l * 4 + 3];
    const float* in_norm = norms_[l * 2].data_ptr<float>();
    const float* post_norm = norms_[l * 2 + 1].data_ptr<float>();
    const int64_t m = a.m, group = heads_ / kv_heads_, qkv_out = qkv.out, half = d_ / 2;

    norm_quantize(h, in_norm, m, hidden_, qkv.q4_1, sc);
    auto [q0, q1] = share((qkv.out + ROWS - 1) / ROWS, t, threads);
    project(qkv, sc.xq, q0, q1, [&](int64_t r, int64_t n, float v) { qkv_[r * qkv_out + n] = v; });
#pragma omp barrier

    // Rotary (adjacent pairs, as models/layers.Rotary), the KV write and attention: per (row, KV head).
    const float* cs_table = cos_sin_.data_ptr<float>();
    auto [a0, a1] = share(m * kv_heads_, t, threads);
    sc.q.resize(static_cast<size_t>(group * d_));
    for (int64_t task = a0; task < a1; ++task) {
      const int64_t r = task / kv_heads_, kvh = task % kv_heads_;
      const float* row = qkv_.data() + r * qkv_out;
      const float* cs = cs_table + a.positions[r] * d_;
      auto rotate = [&](const float* x, auto* dst) {
        using D = std::remove_pointer_t<decltype(dst)>;
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = x[2 * i], x1 = x[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
          dst[2 * i] = static_cast<D>(x0 * c - x1 * s);
          dst[2 * i + 1] = static_cast<D>(x0 * s + x1 * c);
        }
      };
      for (int64_t g = 0; g < group; ++g) rotate(row + (kvh * group + g) * d_, sc.q.data() + g * d_);
      const int64_t slot = a.slots[r];
      const float* v = row + (heads_ + kv_heads_ + kvh) * d_;
      if constexpr (std::is_same_v<T, tessera_attn::Fp8>) {  // FP8 rows: quantized from float32, as write_kv does
        const int64_t hd = d_ + tessera_attn::kScaleElems<T>;
        sc.k.resize(static_cast<size_t>(d_));
        rotate(row + (heads_ + kvh) * d_, sc.k.data());
        tessera_attn::quantize_fp8_row(sc.k.data(), d_, kc + (slot * kv_heads_ + kvh) * hd);
        tessera_attn::quantize_fp8_row(v, d_, vc + (slot * kv_heads_ + kvh) * hd);
      } else {
        rotate(row + (heads_ + kvh) * d_, kc + (slot * kv_heads_ + kvh) * d_);
        T* vdst = vc + (slot * kv_heads_ + kvh) * d_;
        for (int64_t i = 0; i < d_; ++i) vdst[i] = static_cast<T>(v[i]);
      }
      tessera_attn::attend(sc.q.data(), kc, vc, a.tables + r * a.width, a.lens[r], kvh, 1, group, kv_heads_, d_,
                           a.block_size, a.num_blocks, scale_, sc.scores, sc.acc,
                           attn_.data() + (r * heads_ + kvh * group) * d_);
    }
#pragma omp barrier

    quantize_rows(attn_.data(), m, heads_ * d_, o.q4_1, sc.xq);
    auto [o0, o1] = share((o.out + ROWS - 1) / ROWS, t, threads);
    project(o, sc.xq, o0, o1, [&](int64_t r, int64_t n, float v) { h[r * hidden_ + n] += v; });
#pragma omp barrier

    norm_quantize(h, post_norm, m, hidden_, gate_up.q4_1, sc);
    const int64_t inter = intermediate_;
    // The thread's share of the gate rows, then the same share of the up rows (each one sequential
    // stream), then SwiGLU over that share.
    auto [g0, g1] = share((inter + ROWS - 1) / ROWS, t, threads);
    const int64_t e0 = g0 * ROWS, e1 = std::min(g1 * ROWS, inter);
    project(gate_up, sc.xq, g0, g1, [&](int64_t r, int64_t n, float v) { act_[r * inter + n] = v; });
    project_from(gate_up, inter, sc.xq, g0, g1, [&](int64_t r, int64_t n, float v) { up_[r * inter + n] = v; });
    for (int64_t r = 0; r < m; ++r) swiglu(act_.data() + r * inter + e0, up_.data() + r * inter + e0, e1 - e0);
#pragma omp barrier

    quantize_rows(act_.data(), m, inter, down.q4_1, sc.xq);
    auto [d0, d1] = share((down.out + ROWS - 1) / ROWS, t, threads);
    project(down, sc.xq, d0, d1, [&](int64_t r, int64_t n, float v) { h[r * hidden_ + n] += v; });
#pragma omp barrier
  }

  int64_t heads_, kv_heads_, d_;
  float eps_, scale_;
  int64_t hidden_ = 0, intermediate_ = 0;
  torch::Tensor cos_sin_;
  std::vector<torch::Tensor> blocks_, norms_;
  std::vector<Proj> projs_;
  // Step buffers, reused: q/k/v, attention output, gate (then SwiGLU) and up outputs, per-thread scratch.
  std::vector<float> qkv_, attn_, act_, up_;
  std::vector<Scratch> scratch_;
  std::mutex mutex_;
};

}  // namespace

void bind_gguf_decoder(pybind11::module& m) {
  pybind11::class_<GgufDecoder>(m, "GgufDecoder")
      .def(pybind11::init<std::vector<torch::Tensor>, std::vector<int64_t>, std::vector<torch::Tensor>,
                          std::vector<torch::Tensor>, torch::Tensor, int64_t, int64_t, int64_t, double, double>())
      .def("forward", &GgufDecoder::forward, pybind11::call_guard<pybind11::gil_scoped_release>());
}
