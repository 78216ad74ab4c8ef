#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("q4_1_linear", &q4_1_linear, "y = x W^T, W as Q4_1 rows in kernels/gguf_layout.py's layout (uint8)");
  m.def("q8_0_linear", &q8_0_linear, "y = x W^T, W as Q8_0 rows in kernels/gguf_layout.py's layout (uint8)");
  m.def("vectorized", &vectorized, "whether the AVX2 paths were compiled in");
  m.def("paged_decode_attention", &paged_decode_attention_cpu,
        "one query per sequence over the paged KV cache (paged_decode_attention_ref's signature)");
  m.def("rope_write_kv", &rope_write_kv_cpu,
        "q, k rotated from a fused qkv [T, (H + 2 Hkv) D]; k and v written to the caches at their slots");
  m.def("rms_norm", &rms_norm_cpu, "float32 RMSNorm of rows x [rows, n] with weight [n]");
  // no GIL while it runs: the worker's event loop processes the previous step's outputs meanwhile
  m.def("sample_top_k", &sample_top_k_cpu, "a draw among each row's top-k candidates (sample_top_k_ref's signature)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("sample_full", &sample_full_cpu, "a draw over the whole vocabulary (sample_full_ref's signature)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  bind_gguf_decoder(m);
}
