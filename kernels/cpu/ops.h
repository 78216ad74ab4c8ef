// The CPU kernels' entry points, bound to Python in bindings.cpp (loaded by kernels/cpu_ext.py).
#pragma once

#include <torch/extension.h>

// gguf_matmul.cpp: y = x W^T, W as Q4_1 / Q8_0 rows in kernels/gguf_layout.py's layout.
torch::Tensor q4_1_linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t out_features,
                          int64_t in_features);
torch::Tensor q8_0_linear(const torch::Tensor& x, const torch::Tensor& blocks, int64_t out_features,
                          int64_t in_features);
bool vectorized();

// decode_ops.cpp: one decode query per sequence over the paged cache; rotary + KV write; float32 RMSNorm.
torch::Tensor paged_decode_attention_cpu(const torch::Tensor& q, const torch::Tensor& key_cache,
                                         const torch::Tensor& value_cache, const torch::Tensor& block_tables,
                                         const torch::Tensor& context_lens, double scale);
std::vector<torch::Tensor> rope_write_kv_cpu(const torch::Tensor& qkv, const torch::Tensor& cos_sin,
                                             const torch::Tensor& positions, torch::Tensor key_cache,
                                             torch::Tensor value_cache, const torch::Tensor& slots, int64_t heads,
                                             int64_t kv_heads);
torch::Tensor rms_norm_cpu(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// sample_ops.cpp: a step's draw among each row's top-k candidates (kernels.reference.sample_top_k_ref),
// and over the whole vocabulary (sample_full_ref).
torch::Tensor sample_top_k_cpu(const torch::Tensor& logits, const torch::Tensor& temperature, int64_t k,
                               const std::optional<torch::Tensor>& top_k, const std::optional<torch::Tensor>& top_p,
                               const std::optional<torch::Tensor>& min_p, const torch::Tensor& noise,
                               const std::optional<torch::Tensor>& seeds, const std::optional<torch::Tensor>& index);

torch::Tensor sample_full_cpu(const torch::Tensor& logits, const torch::Tensor& temperature,
                              const std::optional<torch::Tensor>& top_k, const std::optional<torch::Tensor>& top_p,
                              const std::optional<torch::Tensor>& min_p, const torch::Tensor& seeds,
                              const torch::Tensor& index);

// gguf_decoder.cpp: a whole decode step over GGUF-block projections (the GgufDecoder class).
void bind_gguf_decoder(pybind11::module& m);
