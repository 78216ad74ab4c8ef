"""Tensor parallelism: one model split across processes (gloo on CPU, NCCL on CUDA); docs/tensor_parallel.md."""
