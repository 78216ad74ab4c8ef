"""The worker's settings: every flag also reads an environment variable, TESSERA_WORKER_<FLAG>.

Precedence: command line, then environment, then the default. `--token` reads
TESSERA_WORKER_TOKEN, the shared secret the gateway sends as `Authorization: Bearer ...`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from dataplane.config import KV_CACHE_DTYPES, QUANTIZATION_METHODS, CacheConfig, LoRAConfig, parse_bytes
from dataplane.sampling_params import POOLING_TYPES
from dataplane.spec_decode.config import SpeculativeConfig

ENV_PREFIX = "TESSERA_WORKER_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(slots=True)
class WorkerConfig:
    model: str  # alias, GGUF file or Hugging Face directory
    served_model_name: str | None = None  # the id clients ask for; defaults to `model`
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 8100
    token: str = ""  # shared worker token; empty: no auth (only sensible on loopback)
    # engine
    dtype: str = "auto"
    # dense projections' storage: auto (float16 under float32 on AVX2/AVX-512 CPUs without native bf16
    # when dtype is auto), the dtype itself, or float16 (float32 compute on the CPU only)
    weight_dtype: str = "auto"
    kv_cache_memory: str = "1GiB"
    # auto (the model's dtype) or fp8 (E4M3 with a scale per token and KV head: about twice the blocks in
    # kv_cache_memory; docs/kv_cache.md). A managed worker (the agent) gates fp8 before serving it
    # (dataplane/quantize/gate.py, method kv_fp8); one that loads its model at start-up serves it unchecked
    kv_cache_dtype: str = "auto"
    # the prefix cache's second tier (docs/kv_cache.md): bytes of evicted KV blocks kept in host memory, or
    # in kv_offload_dir (a local directory this worker alone uses; emptied of its entries at start), and
    # loaded back instead of recomputed; "0": none
    kv_offload_size: str = "0"
    kv_offload_dir: str | None = None
    # disaggregated serving (dataplane/worker/disaggregation.py): prompts of at least prefill_min_tokens
    # tokens are computed by this prefill worker (or these, comma-separated, in turn) and their KV blocks
    # fetched into this worker's second tier (kv_offload_size must be set); any failure there falls back to
    # computing the prompt here
    prefill_url: str | None = None
    prefill_min_tokens: int = 256
    prefill_timeout: float = 30.0  # seconds for a prefill worker's answer (its prefill included)
    block_size: int = 16
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    seed: int = 0
    # ranks the model is split across (dataplane/distributed; gloo processes on a CPU, one GPU each on CUDA);
    # must divide the model's attention and key/value head counts. On a CPU the threads are shared by the ranks.
    tensor_parallel_size: int = 1
    # decode-only steps through torch.compile (dataplane/models/compiled_decode.py): fuses the small ops
    # around the projections; compiles on the first decode step (minutes cold, seconds from Inductor's
    # cache), so off unless asked: on an AVX-512 BF16 EPYC it gained 1.05x at batch 1 (benchmarks.decode_latency)
    compile_decode: bool = False
    # where the engine runs: cpu, or cuda / cuda:N (decode-only steps then replay CUDA graphs captured at
    # start-up, dataplane/runner/decode_graphs.py, unless enforce_eager)
    device: str = "cpu"
    enforce_eager: bool = False  # no CUDA graphs: every step launches its kernels one by one
    # weights: as the checkpoint is (empty), or awq / fp8 / int4 / int8 / gguf (dataplane/quant/checkpoint.py).
    # gguf keeps a GGUF file's Q4_1 / Q8_0 blocks for the C++ CPU kernels: the batch-1 decode path
    # (benchmarks.decode_latency); quantized layers switch to a dense copy above int4_dense_above rows (0: none kept)
    quantization: str | None = None
    int4_dense_above: int = 0
    # torch intra-op threads (default: torch's own choice). On a CPU shared with a gateway or other
    # processes, fewer threads than cores avoids every parallel region waiting for a descheduled one.
    threads: int | None = None
    # ITL guard: while requests of priority <= itl_guard_priority are in the engine, lower priorities get
    # at most itl_guard_tokens prefill tokens per step (dataplane/scheduler). Empty: off.
    itl_guard_priority: int | None = None
    itl_guard_tokens: int = 32
    itl_guard_seqs: int | None = None  # ... and at most this many of them run (empty: no seat cap)
    # ... and while a protected request decodes, each step's prefill (all priorities) is capped (empty: off)
    itl_guard_step_tokens: int | None = None
    # ... or capped to what keeps a step's predicted time within this many ms (fitted online; empty: off)
    itl_guard_step_ms: float | None = None
    # Requests at this priority or past it (the Batch API's lines: TESSERA_BATCH_PRIORITY, 1000) run only
    # in steps online requests leave (dataplane/config.py SchedulerConfig.background_priority; empty: off)
    background_priority: int | None = None
    background_step_ms: float | None = None  # ... and steps of background work alone stay within this (empty: off)
    # Fair sharing between the tenants (X-Tenant-Id, X-Tenant-Weight) of one priority: least-served first
    # (dataplane/scheduler/fairness.py); --no-fair-share: first come, first served within a priority
    fair_share: bool = True
    # Prompt-lookup speculative decoding (dataplane/spec_decode): n-gram draft tokens per step for requests
    # that do not say (body `speculative: {"method": "ngram", "num_tokens": k}`); 0: off unless asked.
    # Proposals stop while more than speculative_max_running requests run (a busy batch gains nothing).
    speculative_ngram_tokens: int = 0
    speculative_max_running: int = 4
    # LoRA adapters (dataplane/lora); loaded at run time through POST /v1/adapters
    enable_lora: bool = False
    max_loras: int = 4  # adapters in device slots at once (distinct adapters per step)
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # registered adapters at most (default 16 x max_loras)
    # adapters load only from inside this folder (after `..` and symlinks); empty: no local adapter paths
    adapter_root: str = ""
    # admission and limits
    max_waiting: int = 128  # engine requests queued beyond this answer 429
    # Per-priority waiting limits, "priority=limit" pairs: a request whose priority is >= a key is
    # refused (429 priority_shed) while that many engine requests wait, so low tiers shed first.
    waiting_limits: str = "20=32,30=8"
    retry_after: int = 1  # seconds, sent with 429 and 503
    max_n: int = 16  # completions per request at most (n, or n x prompts for a batch)
    default_max_tokens: int = 1024  # chat requests without max_tokens (capped by the context left)
    # finished requests' token counts kept for the gateway's usage queries (usage_memory.py): at most
    # this many, for at most this long (the gateway's sweeper asks within minutes of a gateway's death)
    usage_memory_entries: int = 100_000
    usage_memory_seconds: float = 3600.0
    # structured outputs: a grammar must compile within this many seconds (a killable child process
    # probes it first, dataplane/structured/compile_process.py) or the request is a 400; 0: no deadline
    grammar_compile_timeout: float = 10.0
    # tool_choice auto: hermes, llama3_json, pythonic, "auto" (from the model's chat template: Llama 3's
    # tool turns -> llama3_json, ChatML -> hermes) or "none" (auto refused); and whether a call, once
    # opened, is held to a valid call of a given tool (dataplane/worker/tool_parsers/grammar.py)
    tool_call_parser: str = "auto"
    tool_call_constraint: bool = True
    # /v1/embeddings (dataplane/worker/embeddings.py): "last" (token) or "mean" pooling of the final hidden
    # states, L2-normalized; inputs per request at most (each is one engine request, under max_waiting)
    pooling: str = "last"
    max_embedding_inputs: int = 64
    # lifecycle
    # before /ready: run every decode batch size up to max_num_seqs and a ladder of prefill sizes once,
    # so oneDNN's per-shape kernel builds are not paid by the first tenants (dataplane/engine/warmup.py)
    warmup: bool = True
    # after the warm-up: time decode steps per batch size and prefills per size (a few seconds), the
    # load curve capacity planning reads (dataplane/engine/load_curve.py; GET /load_curve, and the
    # agent's "ready" report)
    load_curve: bool = True
    drain_timeout: float = 30.0  # seconds to let in-flight requests finish after SIGTERM
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: must name a model (alias, GGUF file or directory)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be in [0, 65535], got {self.port}")
        parse_bytes(self.kv_cache_memory, name="kv_cache_memory")
        CacheConfig(kv_offload_size=self.kv_offload_size, kv_offload_dir=self.kv_offload_dir,
                    enable_prefix_caching=self.enable_prefix_caching)  # the engine's own checks, before loading
        if self.prefill_url is not None:
            urls = self.prefill_url.split(",")
            if not all(u.startswith(("http://", "https://")) and len(u) > 8 and "\x00" not in u for u in urls):
                raise ValueError(f"prefill_url: http(s) URLs of prefill workers, comma-separated; got {self.prefill_url!r}")
            if self.kv_offload_size in ("0", "", 0):
                raise ValueError("prefill_url: set kv_offload_size too (received blocks are kept in the second tier)")
        if self.prefill_min_tokens < 1 or not self.prefill_timeout > 0:
            raise ValueError("prefill_min_tokens: >= 1 and prefill_timeout: > 0 seconds")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_n", "default_max_tokens", "block_size",
                     "max_embedding_inputs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size: must be >= 1, got {self.tensor_parallel_size}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads: must be >= 1, got {self.threads}")
        if self.quantization in ("", "none"):
            self.quantization = None
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization: {self.quantization!r} is not supported; use one of "
                             f"{', '.join(QUANTIZATION_METHODS)}")
        if self.int4_dense_above < 0:
            raise ValueError(f"int4_dense_above: must be >= 0, got {self.int4_dense_above}")
        if self.itl_guard_step_tokens is not None and self.itl_guard_step_tokens < 1:
            raise ValueError(f"itl_guard_step_tokens: must be >= 1, got {self.itl_guard_step_tokens}")
        if self.itl_guard_step_ms is not None and not self.itl_guard_step_ms > 0:
            raise ValueError(f"itl_guard_step_ms: must be > 0, got {self.itl_guard_step_ms}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting: must be >= 1 (every request waits for the next step), got {self.max_waiting}")
        if self.usage_memory_entries < 1:
            raise ValueError(f"usage_memory_entries: must be >= 1, got {self.usage_memory_entries}")
        if not self.usage_memory_seconds > 0:
            raise ValueError(f"usage_memory_seconds: must be > 0, got {self.usage_memory_seconds}")
        if not self.grammar_compile_timeout >= 0:
            raise ValueError(f"grammar_compile_timeout: must be >= 0 seconds (0: no deadline), got {self.grammar_compile_timeout}")
        if self.retry_after < 0:
            raise ValueError(f"retry_after: must be >= 0, got {self.retry_after}")
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout: must be >= 0, got {self.drain_timeout}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len: must be >= 1, got {self.max_model_len}")
        parse_waiting_limits(self.waiting_limits)  # fails early, naming the field
        if self.tool_call_parser not in ("auto", "none", "hermes", "llama3_json", "pythonic"):
            raise ValueError(f"tool_call_parser: must be auto, none, hermes, llama3_json or pythonic, "
                             f"got {self.tool_call_parser!r}")
        if self.pooling not in POOLING_TYPES:
            raise ValueError(f"pooling: must be one of {', '.join(POOLING_TYPES)}, got {self.pooling!r}")
        SpeculativeConfig(self.speculative_ngram_tokens, self.speculative_max_running)
        if self.enable_lora:
            LoRAConfig(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank, max_cpu_loras=self.max_cpu_loras)
        self.log_level = self.log_level.lower()
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError(f"log_level: must be debug, info, warning or error, got {self.log_level!r}")

    def waiting_limit(self, priority: int) -> int | None:
        """The waiting-queue length at which a request of this priority is refused (None: max_waiting only)."""
        limit = None
        for key, value in parse_waiting_limits(self.waiting_limits):  # a few pairs: cheap
            if priority >= key:
                limit = value
        return limit

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model

    def engine_kwargs(self) -> dict[str, object]:
        return {
            "dtype": self.dtype, "weight_dtype": self.weight_dtype, "kv_cache_memory": self.kv_cache_memory,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_offload_size": self.kv_offload_size, "kv_offload_dir": self.kv_offload_dir,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len, "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens, "max_waiting": self.max_waiting,
            "enable_prefix_caching": self.enable_prefix_caching, "seed": self.seed, "progress": False,
            "tensor_parallel_size": self.tensor_parallel_size, "compile_decode": self.compile_decode,
            "device": self.device, "cuda_graphs": "off" if self.enforce_eager else "auto",
            **({"quantization": self.quantization} if self.quantization else {}),
            "int4_dense_above": self.int4_dense_above,
            "itl_guard_priority": self.itl_guard_priority, "itl_guard_tokens": self.itl_guard_tokens,
            "itl_guard_seqs": self.itl_guard_seqs, "itl_guard_step_tokens": self.itl_guard_step_tokens,
            "itl_guard_step_ms": self.itl_guard_step_ms, "background_priority": self.background_priority,
            "background_step_ms": self.background_step_ms,
            "fair_share": self.fair_share,
            "speculative_ngram_tokens": self.speculative_ngram_tokens,
            "speculative_max_running": self.speculative_max_running,
            "grammar_compile_timeout": self.grammar_compile_timeout or None,
            **({"enable_lora": True, "max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank,
                "max_cpu_loras": self.max_cpu_loras} if self.enable_lora else {}),
        }


def parse_waiting_limits(raw: str) -> list[tuple[int, int]]:
    table = []
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        priority, sep, limit = pair.partition("=")
        try:
            if not sep or int(limit) < 0:
                raise ValueError
            table.append((int(priority), int(limit)))
        except ValueError:
            raise ValueError(f"waiting_limits: expected priority=limit pairs (limit >= 0), got {pair!r}") from None
    return sorted(table)


def _env_bool(raw: str, name: str) -> bool:
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ValueError(f"{name}: cannot read {raw!r} as a boolean (use true or false)")


def _optional_int(raw: str) -> int | None:
    return None if raw.lower() in ("", "none") else int(raw)


def _optional_float(raw: str) -> float | None:
    return None if raw.lower() in ("", "none") else float(raw)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dataplane.worker",
        description="Tessera data-plane worker: one engine behind an OpenAI-compatible HTTP API. "
                    f"Every flag can also be set as {ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}PORT=8101).")
    types = {"port": int, "block_size": int, "max_num_seqs": int, "max_num_batched_tokens": int, "seed": int,
             "max_waiting": int, "retry_after": int, "max_n": int, "default_max_tokens": int,
             "drain_timeout": float, "max_model_len": _optional_int, "max_loras": int, "max_lora_rank": int,
             "max_cpu_loras": _optional_int, "itl_guard_priority": _optional_int, "itl_guard_tokens": int, "itl_guard_seqs": _optional_int,
             "itl_guard_step_tokens": _optional_int, "itl_guard_step_ms": _optional_float,
             "background_priority": _optional_int, "background_step_ms": _optional_float,
             "speculative_ngram_tokens": int, "speculative_max_running": int,
             "threads": _optional_int, "tensor_parallel_size": int, "int4_dense_above": int, "usage_memory_entries": int, "usage_memory_seconds": float,
             "grammar_compile_timeout": float, "max_embedding_inputs": int,
             "prefill_min_tokens": int, "prefill_timeout": float}
    for f in fields(WorkerConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(flag, type=types.get(f.name, str), default=None,
                                help=f"(env {ENV_PREFIX}{f.name.upper()})")
    return parser


def load_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> WorkerConfig:
    """Flags over environment over defaults; raises ValueError naming the bad setting."""
    env = os.environ if env is None else env
    args = vars(build_parser().parse_args(argv))
    values: dict[str, object] = {}
    for f in fields(WorkerConfig):
        value = args.get(f.name)
        raw = env.get(ENV_PREFIX + f.name.upper())
        if value is None and raw is not None:
            try:
                if f.type == "bool":
                    value = _env_bool(raw, f.name)
                elif f.type == "int | None":
                    value = _optional_int(raw)
                elif f.type == "float | None":
                    value = _optional_float(raw)
                elif f.type in ("int", "float"):
                    value = int(raw) if f.type == "int" else float(raw)
                else:
                    value = raw
            except ValueError as exc:
                raise ValueError(f"{f.name}: cannot read {ENV_PREFIX}{f.name.upper()}={raw!r} ({exc})") from None
        if value is not None:
            values[f.name] = value
    if "model" not in values:
        raise ValueError(f"model: required (--model or {ENV_PREFIX}MODEL)")
    return WorkerConfig(**values)  # type: ignore[arg-type]
