// The small per-layer ops of a CPU decode step, each one call instead of a dozen torch ops.
//
// Why: at batch 1 a 135M model's step is ~30 layers x ~40 torch ops of a few microseconds each
// (dispatch, allocation, an OpenMP region), more time than its weights take to stream once they
// are 4-bit. Attention over the paged cache was the largest share (block gather, a block-diagonal
// query, two batched matmuls, mask, softmax, stack: ~20 ops a layer), then RMSNorm (F.rms_norm
// took 21-29 us for one 576-wide row on an AVX2 EPYC), then rotary + the KV write (~34 us). Twins:
// kernels/reference.py's paged_decode_attention_ref (the Triton kernel's signature), Rotary.rotate +
// write_kv (dataplane), and F.rms_norm.

#include "ops.h"

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "decode_math.h"

namespace {

using namespace tessera_attn;

template <typename T>
void decode_attention(const float* q, const T* kc, const T* vc, const int64_t* tables, int64_t table_width,
                      const int64_t* lens, float* out, int64_t seqs, int64_t heads, int64_t kv_heads, int64_t d,
                      int64_t block_size, int64_t num_blocks, float scale) {
  const int64_t group = heads / kv_heads;
  int64_t total = 0;
  for (int64_t s = 0; s < seqs; ++s) total += lens[s];
  // Tasks are whole sequences (all heads: contiguous rows) unless there are fewer sequences than
  // threads and enough work to split, then (sequence, KV head). A task is ~context x heads x d
  // multiply-adds; below ~64k per thread waking one does not pay (a batch-1 step's 3 tasks at 180
  // keys ran 2x slower split over two threads).
  const int64_t threads = at::get_num_threads();
  const int64_t per_seq = std::max<int64_t>(1, total / std::max<int64_t>(seqs, 1) * heads * d);
  const bool split = seqs < threads && per_seq / kv_heads >= (int64_t{1} << 16);
  const int64_t span = split ? 1 : kv_heads;  // KV heads per task
  const int64_t per_task = split ? per_seq / kv_heads : per_seq;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / per_task);
  at::parallel_for(0, seqs * (kv_heads / span), grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / (kv_heads / span), h0 = task % (kv_heads / span) * span;
      const int64_t first = s * heads + h0 * group;  // the task's first query head
      attend(q + first * d, kc, vc, tables + s * table_width, lens[s], h0, span, group, kv_heads, d, block_size,
             num_blocks, scale, scores, acc, out + first * d);
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
  const auto cache_type = key_cache.scalar_type();
  TORCH_CHECK(value_cache.scalar_type() == cache_type &&
                  (cache_type == torch::kFloat32 || cache_type == torch::kBFloat16 || cache_type == torch::kByte),
              "paged_decode_attention: float32 or bfloat16 caches, or FP8 ones (uint8 rows, kernels/kv_fp8.py)");
  const int64_t seqs = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(1), kv_heads = key_cache.size(2);
  const int64_t row = cache_type == torch::kByte ? d + tessera_attn::kScaleElems<tessera_attn::Fp8> : d;  // FP8: values, then a float16 scale
  TORCH_CHECK(key_cache.size(3) == row && kv_heads > 0 && heads % kv_heads == 0,
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
  if (cache_type == torch::kByte) {
    decode_attention<tessera_attn::Fp8>(
        qf.data_ptr<float>(), reinterpret_cast<const tessera_attn::Fp8*>(key_cache.data_ptr<uint8_t>()),
        reinterpret_cast<const tessera_attn::Fp8*>(value_cache.data_ptr<uint8_t>()), tables.data_ptr<int64_t>(),
        width, lp, out.data_ptr<float>(), seqs, heads, kv_heads, d, block_size, num_blocks, static_cast<float>(scale));
  } else if (cache_type == torch::kFloat32) {
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

// The rotary embedding of q and k from a fused qkv output, written with v to the paged cache.
// Rotary over adjacent pairs (the loader interleaves q/k rows for it, models/layers.Rotary):
// (a, b) at pair i of a head -> (a cos - b sin, a sin + b cos), angle table cos_sin [max_pos, D/2, 2]
// (Rotary.cis as real pairs), in float32 and rounded once to the output dtype, as Rotary.apply.
// Replaces Rotary.rotate and write_kv: seven torch ops and two index_copy_ per layer. An FP8 cache
// (C = Fp8) gets each row quantized as kernels/kv_fp8.quantize does from the T values: the same bytes.
template <typename T, typename C>
inline void store_row(const T* src, int64_t d, C* dst, std::vector<float>& buf) {
  if constexpr (std::is_same_v<C, Fp8>) {
    for (int64_t i = 0; i < d; ++i) buf[static_cast<size_t>(i)] = static_cast<float>(src[i]);
    quantize_fp8_row(buf.data(), d, dst);
  } else {
    std::copy(src, src + d, dst);
  }
}

template <typename T, typename C>
void rope_kv(const T* qkv, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t d, const float* cos_sin,
             const int64_t* positions, const int64_t* slots, T* q_out, T* k_out, C* key_cache, C* value_cache) {
  const int64_t width = (heads + 2 * kv_heads) * d, half = d / 2, hd = d + kScaleElems<C>;
  std::vector<float> buf(static_cast<size_t>(d));
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = qkv + t * width;
    const float* cs = cos_sin + positions[t] * half * 2;
    const int64_t slot = slots[t];  // checked by the caller, before anything is written
    for (int64_t h = 0; h < heads + kv_heads; ++h) {
      const T* x = row + h * d;
      T* dst = h < heads ? q_out + (t * heads + h) * d : k_out + (t * kv_heads + h - heads) * d;
      for (int64_t i = 0; i < half; ++i) {
        const float a = static_cast<float>(x[2 * i]), b = static_cast<float>(x[2 * i + 1]);
        const float c = cs[2 * i], s = cs[2 * i + 1];
        dst[2 * i] = static_cast<T>(a * c - b * s);
        dst[2 * i + 1] = static_cast<T>(a * s + b * c);
      }
      if (h >= heads) store_row(dst, d, key_cache + (slot * kv_heads + h - heads) * hd, buf);
    }
    for (int64_t h = 0; h < kv_heads; ++h)
      store_row(row + (heads + kv_heads + h) * d, d, value_cache + (slot * kv_heads + h) * hd, buf);
  }
}

std::vector<torch::Tensor> rope_write_kv_cpu(const torch::Tensor& qkv, const torch::Tensor& cos_sin,
                                             const torch::Tensor& positions, torch::Tensor key_cache,
                                             torch::Tensor value_cache, const torch::Tensor& slots, int64_t heads,
                                             int64_t kv_heads) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous(), "rope_write_kv: qkv must be a contiguous [tokens, width]");
  TORCH_CHECK(heads > 0 && kv_heads > 0 && qkv.size(1) % (heads + 2 * kv_heads) == 0,
              "rope_write_kv: qkv width does not split into the head counts");
  const int64_t tokens = qkv.size(0), d = qkv.size(1) / (heads + 2 * kv_heads);
  TORCH_CHECK(d % 2 == 0, "rope_write_kv: head_dim must be even");
  const bool fp8 = key_cache.scalar_type() == torch::kByte;  // kernels/kv_fp8.py's rows: d values + a scale
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && key_cache.sizes() == value_cache.sizes() &&
                  key_cache.dim() == 4 && key_cache.size(2) == kv_heads &&
                  key_cache.size(3) == d + (fp8 ? kScaleElems<Fp8> : 0),
              "rope_write_kv: caches must be contiguous [blocks, block_size, kv_heads, head_dim (+ 2 for FP8)]");
  TORCH_CHECK((fp8 || key_cache.scalar_type() == qkv.scalar_type()) && value_cache.scalar_type() == key_cache.scalar_type(),
              "rope_write_kv: caches and qkv must share a dtype (or the caches be FP8)");
  TORCH_CHECK(cos_sin.scalar_type() == torch::kFloat32 && cos_sin.is_contiguous() && cos_sin.dim() == 3 &&
                  cos_sin.size(1) == d / 2 && cos_sin.size(2) == 2,
              "rope_write_kv: cos_sin must be a contiguous float32 [max_pos, head_dim / 2, 2]");
  TORCH_CHECK(positions.numel() == tokens && slots.numel() == tokens, "rope_write_kv: one position and slot per token");
  const auto pos = positions.to(torch::kInt64).contiguous();
  const auto sl = slots.to(torch::kInt64).contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t* sp = sl.data_ptr<int64_t>();
  const int64_t cache_slots = key_cache.size(0) * key_cache.size(1);
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(pp[t] >= 0 && pp[t] < cos_sin.size(0), "rope_write_kv: position ", pp[t], " beyond the table");
    TORCH_CHECK(sp[t] >= 0 && sp[t] < cache_slots, "rope_write_kv: slot ", sp[t], " out of range");
  }
  auto q = torch::empty({tokens, heads, d}, qkv.options());
  auto k = torch::empty({tokens, kv_heads, d}, qkv.options());
  TORCH_CHECK(qkv.scalar_type() == torch::kFloat32 || qkv.scalar_type() == torch::kBFloat16,
              "rope_write_kv: float32 or bfloat16");
  Fp8* k8 = fp8 ? reinterpret_cast<Fp8*>(key_cache.data_ptr<uint8_t>()) : nullptr;
  Fp8* v8 = fp8 ? reinterpret_cast<Fp8*>(value_cache.data_ptr<uint8_t>()) : nullptr;
  if (qkv.scalar_type() == torch::kFloat32) {
    const auto* x = qkv.data_ptr<float>();
    const float* cs = cos_sin.data_ptr<float>();
    if (fp8) {
      rope_kv(x, tokens, heads, kv_heads, d, cs, pp, sp, q.data_ptr<float>(), k.data_ptr<float>(), k8, v8);
    } else {
      rope_kv(x, tokens, heads, kv_heads, d, cs, pp, sp, q.data_ptr<float>(), k.data_ptr<float>(),
              key_cache.data_ptr<float>(), value_cache.data_ptr<float>());
    }
  } else {
    const auto* x = qkv.data_ptr<c10::BFloat16>();
    const float* cs = cos_sin.data_ptr<float>();
    if (fp8) {
      rope_kv(x, tokens, heads, kv_heads, d, cs, pp, sp, q.data_ptr<c10::BFloat16>(), k.data_ptr<c10::BFloat16>(),
              k8, v8);
    } else {
      rope_kv(x, tokens, heads, kv_heads, d, cs, pp, sp, q.data_ptr<c10::BFloat16>(), k.data_ptr<c10::BFloat16>(),
              key_cache.data_ptr<c10::BFloat16>(), value_cache.data_ptr<c10::BFloat16>());
    }
  }
  return {q, k};
}
