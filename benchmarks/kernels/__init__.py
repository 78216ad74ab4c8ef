"""Kernel benchmarks: `python -m benchmarks.kernels` runs them all, `python -m benchmarks.kernels.bench_<op>` one."""
