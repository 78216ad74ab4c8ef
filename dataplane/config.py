"""Engine configuration: plain, validated dataclasses.

Each `__post_init__` names the field and the reason when a value is refused, so a bad
flag on the worker's command line reads as a sentence, not a stack trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from dataplane.cpu_features import cpu_has_native_bf16
from dataplane.spec_decode.config import SpeculativeConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_CACHE_DTYPES = ("auto", "fp8")  # CacheConfig.kv_cache_dtype
# ModelConfig.quantization: the weights' methods quant/checkpoint.py builds layers for (named here, below it,
# so that a setting is checked without loading the layers)
QUANTIZATION_METHODS = ("awq", "fp8", "int4", "int8", "gguf")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_bytes(value: int | str, *, name: str) -> int:
    """Accept 536870912, "512MiB", "0.5GiB" (binary units whatever the suffix's spelling)."""
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name}: cannot read {value!r} as a size (e.g. 536870912 or '512MiB')")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"{name}: must be positive, got {value!r}")
    return n


def resolve_dtype(dtype: str | torch.dtype, device: str = "cpu") -> torch.dtype:
    """A dtype name (or 'auto') to a torch dtype; 'auto' picks the fastest 16-bit type the device
    computes natively, else float32."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype: {dtype} is not supported; use one of {sorted(_DTYPES)}")
        return dtype
    if dtype == "auto":
        if str(device).startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        # With AVX-512 BF16, bf16 GEMMs ran ~4.5x faster than fp32 (shared/MACHINE.md). Without it
        # (an AVX2-only EPYC) bf16 is emulated: a batch-32 decode step of SmolLM2 took 824 ms in bf16
        # against 204 ms in float32 (benchmarks/results/linear_cpu.md; batch 1: 43 against 53 ms).
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not supported; use one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


def fp16_weights_supported() -> bool:
    """Whether this torch and CPU run float32 products on float16-stored weights (FBGEMM's fp16 GEMM,
    x86 with AVX2 or better)."""
    return ("fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_prepack_fp16")
            and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))


def resolve_weight_dtype(weight_dtype: str, dtype: str | torch.dtype, compute: torch.dtype,
                         device: str = "cpu") -> torch.dtype | None:
    """The dtype dense projection weights are stored in when it differs from the compute dtype, else
    None. Only float16 weights under float32 compute on the CPU differ (FBGEMM converts them to
    float32 in registers): a CPU decode step streams every weight once, so halving the bytes nearly
    halves a small batch's step where bf16 is emulated (benchmarks/results/linear_cpu.md).

    'auto' takes float16 only where `dtype` was 'auto' too and resolved to float32 on such a CPU; an
    explicit dtype='float32' keeps float32 weights, so float32 stays exact unless asked."""
    on_cpu = str(device).startswith("cpu")
    if weight_dtype == "auto":
        if dtype == "auto" and compute == torch.float32 and on_cpu and fp16_weights_supported():
            return torch.float16
        return None
    if weight_dtype not in _DTYPES:
        raise ValueError(f"weight_dtype: {weight_dtype!r} is not supported; use 'auto', 'float16' or the dtype itself")
    wanted = _DTYPES[weight_dtype]
    if wanted == compute:
        return None
    if wanted == torch.float16 and compute == torch.float32 and on_cpu:
        if not fp16_weights_supported():
            raise ValueError("weight_dtype: float16 weights under float32 compute need FBGEMM (x86 with AVX2); "
                             "this torch or CPU has none")
        return torch.float16
    raise ValueError(f"weight_dtype: {weight_dtype} weights under {str(compute).removeprefix('torch.')} compute "
                     f"on {device} are not supported; only float16 under float32 on the CPU")


@dataclass(slots=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    kv_cache_memory: int | str = "1GiB"  # bytes of KV cache to allocate (all layers, K and V)
    enable_prefix_caching: bool = True  # reuse full blocks across requests with equal prefixes
    # "auto": K and V in the model's dtype; "fp8": float8 E4M3 with a float16 scale per token and KV head
    # (kernels/kv_fp8.py), about twice the blocks in the same kv_cache_memory (docs/kv_cache.md)
    kv_cache_dtype: str = "auto"
    # The prefix cache's second tier (kv_cache/second_tier.py): blocks evicted from the KV cache are kept,
    # up to this many bytes, in host memory (or in kv_offload_dir), and loaded back instead of recomputed
    # (0: no second tier).
    kv_offload_size: int | str = 0
    kv_offload_dir: str | None = None  # a local directory for the second tier, one engine's own (None: memory)

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size: must be a positive power of two, got {self.block_size!r}")
        self.kv_cache_memory = parse_bytes(self.kv_cache_memory, name="kv_cache_memory")
        if self.kv_offload_size not in (0, "0", "", None):
            self.kv_offload_size = parse_bytes(self.kv_offload_size, name="kv_offload_size")
            if not self.enable_prefix_caching:
                raise ValueError("kv_offload_size: the second tier keeps prefix-cache blocks; "
                                 "enable_prefix_caching is off")
        else:
            self.kv_offload_size = 0
        if self.kv_offload_dir is not None:
            if not isinstance(self.kv_offload_dir, str) or not self.kv_offload_dir or "\x00" in self.kv_offload_dir:
                raise ValueError(f"kv_offload_dir: must be a directory path, got {self.kv_offload_dir!r}")
            if not self.kv_offload_size:
                raise ValueError("kv_offload_dir: set kv_offload_size too (the directory's byte cap)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # running requests at most
    max_num_batched_tokens: int = 512  # tokens in one forward pass (prefill chunks + decodes)
    max_waiting: int | None = None  # refuse new requests beyond this many waiting (None: unbounded)
    aging_seconds: float = 10.0  # a waiting request gains one priority level per this many seconds
    long_prefill_token_threshold: int = 0  # cap one request's prefill chunk (0: no cap but the budget)
    # ITL guard: while any request of priority <= itl_guard_priority is running or waiting, requests of
    # a lower priority get at most itl_guard_tokens prefill tokens per step between them, so their long
    # prompts cannot stretch the protected tiers' decode steps (None: off).
    itl_guard_priority: int | None = None
    itl_guard_tokens: int = 32
    # ... and, under the same condition, at most this many lower-priority requests are admitted to run
    # (a decode step's time grows with its batch on a CPU); None: no seat cap.
    itl_guard_seqs: int | None = None
    # ... and, while one of the protected requests is decoding, a step's prefill tokens of every priority
    # (protected ones first) total at most this many: a 32-token chunk beside 8 decodes doubles a CPU
    # step's matmul time, and every decoding protected request waits for that step (None: no cap).
    itl_guard_step_tokens: int | None = None
    # ... and/or a step-time target (ms): while a protected request decodes, each step's prefill tokens are
    # capped so the step's predicted time (scheduler/step_cost.py, fitted online to the runner's own
    # timings) stays within it; never below a few tokens, so protected arrivals still start (None: off).
    itl_guard_step_ms: float | None = None
    # Background work (the Batch API's lines): requests of this priority or past it run only in steps
    # the others leave. While any request of a lower number is running or waiting, background requests
    # are neither admitted nor stepped; their KV blocks stay (they resume where they were), and a seat
    # or blocks an online request needs are taken from them by preemption as usual (None: no background).
    background_priority: int | None = None
    # ... and while only background work is in the engine, each step's prefill is capped so its predicted
    # time stays within this many ms: an online arrival waits at most about that for the step in flight
    # (None: background steps take the whole token budget).
    background_step_ms: float | None = None
    # Prompt-lookup speculative decoding (dataplane/spec_decode): drafts per step, the running-batch
    # size past which no proposals are made, the n-gram lengths looked up.
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    # Fair sharing between tenants of one priority (scheduler/fairness.py, VTC): a tier's waiting
    # requests are admitted least-served tenant first, service counted as input_weight per prompt token
    # computed + output_weight per token generated, over the tenant's weight. On by default: with one
    # tenant per tier the order is exactly FCFS, so it only changes anything when tenants compete.
    fair_share: bool = True
    fair_share_input_weight: float = 1.0
    fair_share_output_weight: float = 2.0  # the paper's choice: a decode step costs more than a prefill token
    # Overlapped scheduling (engine/core.py): step N+1 is scheduled and launched while step N's tokens are
    # still on the device; their host work (the scheduler's update, outputs) follows the launch. None:
    # on a CUDA device (a CPU's forward runs in the calling thread, so there is nothing to overlap).
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens: must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_waiting is not None and self.max_waiting < 1:
            # Every request waits at least until the next step, so 0 would refuse them all.
            raise ValueError(f"max_waiting: must be >= 1 or None, got {self.max_waiting}")
        if self.aging_seconds <= 0:
            raise ValueError(f"aging_seconds: must be > 0, got {self.aging_seconds}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold: must be >= 0")
        if self.itl_guard_tokens < 0:
            raise ValueError(f"itl_guard_tokens: must be >= 0, got {self.itl_guard_tokens}")
        if self.itl_guard_seqs is not None and self.itl_guard_seqs < 0:
            raise ValueError(f"itl_guard_seqs: must be >= 0 or None, got {self.itl_guard_seqs}")
        if self.itl_guard_step_tokens is not None and self.itl_guard_step_tokens < 1:
            # 0 would stop every prefill while a protected request decodes, its own queue included.
            raise ValueError(f"itl_guard_step_tokens: must be >= 1 or None, got {self.itl_guard_step_tokens}")
        if self.background_step_ms is not None and not self.background_step_ms > 0:
            raise ValueError(f"background_step_ms: must be > 0 or None, got {self.background_step_ms}")
        if self.itl_guard_step_ms is not None and not self.itl_guard_step_ms > 0:
            raise ValueError(f"itl_guard_step_ms: must be > 0 or None, got {self.itl_guard_step_ms}")
        for name in ("fair_share_input_weight", "fair_share_output_weight"):
            w = getattr(self, name)
            if not isinstance(w, int | float) or not 0 <= w < float("inf") or (
                    name == "fair_share_output_weight" and w == 0 == self.fair_share_input_weight):
                raise ValueError(f"{name}: must be a finite number >= 0 (not both 0), got {w!r}")


@dataclass(slots=True)
class ModelConfig:
    model: str  # alias, GGUF file, or Hugging Face directory
    dtype: str = "auto"  # float32 | bfloat16 | float16 | auto
    # dense projection weights' storage: auto | the dtype | float16 under float32 on the CPU (resolve_weight_dtype)
    weight_dtype: str = "auto"
    device: str = "cpu"
    max_model_len: int | None = None  # context length; defaults to the model's own
    seed: int = 0  # seeds the engine's generator for requests that bring no seed
    quantization: str | None = None  # None (as the checkpoint is) | awq | fp8 | int4 | int8 (dataplane/quant)
    quantize_lm_head: bool = False  # also quantize the output projection (kept in `dtype` by default)
    int4_dense_above: int = 0  # int4: keep a dense copy, used for batches above this many rows (0: no copy)
    # decode-only steps through torch.compile (models/compiled_decode.py; CPU torch path, eager fallback).
    # Off by default: on an AVX-512 BF16 EPYC it gained little over eager (2 threads, quiet host: 1.05x at
    # batch 1, 1.08x at 32 concurrent; 1 thread: none; benchmarks/results/decode_latency*.md), since the
    # step is mostly the projections' weight streaming, and a first step compiles for 10-20 s with
    # Inductor's on-disk cache, minutes without.
    compile_decode: bool = False
    # ranks the model is split across (dataplane/distributed): heads and MLP columns per rank; must divide
    # the model's attention and key/value head counts (checked at load, where they are known)
    tensor_parallel_size: int = 1
    # decode-only steps as CUDA graphs (runner/decode_graphs.py): "auto" (on a CUDA device, one rank),
    # "off" (eager: vLLM's enforce_eager), "cuda", or "padded" (the graph-safe padded step run eagerly,
    # no capture: how the CPU tests it)
    cuda_graphs: str = "auto"
    torch_dtype: torch.dtype = field(init=False)
    torch_weight_dtype: torch.dtype | None = field(init=False)  # None: weights in torch_dtype

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: must name a model (alias, GGUF file or directory)")
        self.torch_dtype = resolve_dtype(self.dtype, self.device)
        self.torch_weight_dtype = resolve_weight_dtype(self.weight_dtype, self.dtype, self.torch_dtype, self.device)
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len: must be >= 1, got {self.max_model_len}")
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization: {self.quantization!r} is not supported; use one of "
                             f"{', '.join(QUANTIZATION_METHODS)} or None")
        if self.int4_dense_above < 0:
            raise ValueError(f"int4_dense_above: must be >= 0, got {self.int4_dense_above}")
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size: must be an integer >= 1, got {self.tensor_parallel_size!r}")
        if self.cuda_graphs not in ("auto", "off", "cuda", "padded"):
            raise ValueError(f"cuda_graphs: must be one of auto, off, cuda, padded; got {self.cuda_graphs!r}")
        if self.cuda_graphs == "cuda" and not str(self.device).startswith("cuda"):
            raise ValueError(f"cuda_graphs: 'cuda' needs a CUDA device, not {self.device!r}")

    @property
    def graph_mode(self) -> str | None:
        """The decode-graph mode the engine runs: 'cuda', 'padded' or None (eager). A tensor parallel engine
        runs graphs when asked ('cuda' or 'padded': every rank replays its own, told each step by rank 0),
        not by default ('auto' stays eager there: the per-rank graphs with NCCL inside have not run on a
        multi-GPU host yet)."""
        if self.cuda_graphs == "auto":
            return "cuda" if str(self.device).startswith("cuda") and self.tensor_parallel_size == 1 else None
        if self.cuda_graphs == "off":
            return None
        return self.cuda_graphs

    @property
    def dtype_label(self) -> str:
        """The resolved dtypes in words: 'bfloat16', or 'float32 (float16 weights)'."""
        name = str(self.torch_dtype).removeprefix("torch.")
        if self.torch_weight_dtype is None:
            return name
        return f"{name} ({str(self.torch_weight_dtype).removeprefix('torch.')} weights)"


# The projections a LoRA adapter may target, in PEFT's names.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_MAX_RANK = 64


@dataclass(slots=True)
class LoRAConfig:
    max_loras: int = 4  # adapters resident in device slots at once, hence distinct adapters per step
    max_lora_rank: int = 16  # largest rank accepted; slot buffers are sized for it
    max_cpu_loras: int | None = None  # registered (host-resident) adapters at most; None: 16 x max_loras

    def __post_init__(self) -> None:
        if not isinstance(self.max_loras, int) or self.max_loras < 1:
            raise ValueError(f"max_loras: must be an integer >= 1, got {self.max_loras!r}")
        if not isinstance(self.max_lora_rank, int) or not 1 <= self.max_lora_rank <= LORA_MAX_RANK:
            raise ValueError(f"max_lora_rank: must be an integer in [1, {LORA_MAX_RANK}], got {self.max_lora_rank!r}")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = 16 * self.max_loras
        if not isinstance(self.max_cpu_loras, int) or self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras: must be an integer >= max_loras ({self.max_loras}), "
                             f"got {self.max_cpu_loras!r}")
