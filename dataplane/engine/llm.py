"""The offline API: `LLM(...).generate(prompts, params)` and `.chat(conversations, params)`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from dataplane.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig
from dataplane.engine.core import EngineCore, PromptInput
from dataplane.lora.manager import AdapterInfo
from dataplane.models.loader import LoadedModel
from dataplane.outputs import RequestOutput
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.fairness import assign_tenant
from dataplane.spec_decode.config import SpeculativeConfig
from dataplane.structured.backend import DEFAULT_COMPILE_TIMEOUT


class LLM:
    def __init__(self, model: str, *, dtype: str = "auto", weight_dtype: str = "auto", device: str = "cpu",
                 block_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 512, kv_cache_memory: int | str = "1GiB",
                 enable_prefix_caching: bool = True, kv_cache_dtype: str = "auto", max_model_len: int | None = None,
                 kv_offload_size: int | str = 0, kv_offload_dir: str | None = None,
                 seed: int = 0,
                 long_prefill_token_threshold: int = 0, aging_seconds: float = 10.0,
                 itl_guard_priority: int | None = None, itl_guard_tokens: int = 32, itl_guard_seqs: int | None = None,
                 itl_guard_step_tokens: int | None = None, itl_guard_step_ms: float | None = None,
                 background_priority: int | None = None, background_step_ms: float | None = None,
                 fair_share: bool = True,
                 quantization: str | None = None, quantize_lm_head: bool = False, int4_dense_above: int = 0,
                 enable_lora: bool = False, max_loras: int = 4, max_lora_rank: int = 16,
                 max_cpu_loras: int | None = None,
                 speculative_ngram_tokens: int = 0, speculative_max_running: int = 4, prompt_lookup_min: int = 2,
                 prompt_lookup_max: int = 4,
                 grammar_compile_timeout: float | None = DEFAULT_COMPILE_TIMEOUT, tensor_parallel_size: int = 1,
                 cuda_graphs: str = "auto", enforce_eager: bool = False, async_scheduling: bool | None = None,
                 progress: bool = False, preloaded: LoadedModel | None = None) -> None:
        """`cuda_graphs`: decode-only steps as CUDA graphs ("auto": on a CUDA device; "padded": the
        graph-safe step run eagerly, for tests); `enforce_eager=True` is cuda_graphs="off"."""
        lora = LoRAConfig(max_loras=max_loras, max_lora_rank=max_lora_rank,
                          max_cpu_loras=max_cpu_loras) if enable_lora else None
        self.core = EngineCore(
            ModelConfig(model=model, dtype=dtype, weight_dtype=weight_dtype, device=device,
                        max_model_len=max_model_len, seed=seed, quantization=quantization,
                        quantize_lm_head=quantize_lm_head, int4_dense_above=int4_dense_above,
                        tensor_parallel_size=tensor_parallel_size,
                        cuda_graphs="off" if enforce_eager else cuda_graphs),
            CacheConfig(block_size=block_size, kv_cache_memory=kv_cache_memory,
                        enable_prefix_caching=enable_prefix_caching, kv_cache_dtype=kv_cache_dtype,
                        kv_offload_size=kv_offload_size, kv_offload_dir=kv_offload_dir),
            SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            long_prefill_token_threshold=long_prefill_token_threshold, aging_seconds=aging_seconds,
                            itl_guard_priority=itl_guard_priority, itl_guard_tokens=itl_guard_tokens,
                            itl_guard_seqs=itl_guard_seqs, itl_guard_step_tokens=itl_guard_step_tokens,
                            itl_guard_step_ms=itl_guard_step_ms,
                            speculative=SpeculativeConfig(speculative_ngram_tokens, speculative_max_running,
                                                          prompt_lookup_min, prompt_lookup_max),
                            background_priority=background_priority, background_step_ms=background_step_ms,
                            fair_share=fair_share, async_scheduling=async_scheduling),
            progress=progress,
            preloaded=preloaded,
            lora_config=lora,
            grammar_compile_timeout=grammar_compile_timeout,
        )
        self.tokenizer = self.core.tokenizer

    def generate(self, prompts: PromptInput | Sequence[PromptInput],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 priorities: Sequence[int] | None = None, cache_salts: Sequence[str | None] | None = None,
                 adapters: Sequence[str | None] | None = None, tenants: Sequence[str | None] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts (strings or token-id lists) to completion; one RequestOutput per prompt, in order.

        adapters: a LoRA adapter name (see add_adapter) or None for the base model, per prompt.
        tenants: whose each prompt is, for fair sharing within a priority (None: the anonymous bucket).
        """
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        params = params if params is not None else SamplingParams()
        param_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(param_list) != len(prompts):
            raise ValueError(f"params: got {len(param_list)} SamplingParams for {len(prompts)} prompts")
        for name, seq in (("priorities", priorities), ("cache_salts", cache_salts), ("adapters", adapters),
                          ("tenants", tenants)):
            if seq is not None and len(seq) != len(prompts):
                raise ValueError(f"{name}: got {len(seq)} values for {len(prompts)} prompts")
        # Validate everything before queueing anything: one bad prompt refuses the whole call.
        built = [self.core.make_requests(p, sp, priority=priorities[i] if priorities else 0,
                                         cache_salt=cache_salts[i] if cache_salts else None,
                                         adapter=adapters[i] if adapters else None)
                 for i, (p, sp) in enumerate(zip(prompts, param_list, strict=True))]
        for i, (rid, text, children) in enumerate(built):
            assign_tenant(children, tenants[i] if tenants else None)
            self.core.add(rid, text, children)
        return self._run([rid for rid, _, _ in built], use_tqdm)

    def embed(self, prompts: PromptInput | Sequence[PromptInput], *, pooling: str = "last",
              priorities: Sequence[int] | None = None, cache_salts: Sequence[str | None] | None = None,
              ) -> list[list[float] | None]:
        """Pooled, L2-normalized final hidden states, one per prompt in order (runner/pooling.py);
        None for a prompt whose request failed."""
        outs = self.generate(prompts, SamplingParams(max_tokens=0, pooling=pooling), priorities=priorities,
                             cache_salts=cache_salts)
        return [o.embedding for o in outs]

    def add_adapter(self, name: str, path: str) -> None:
        """Load a PEFT LoRA adapter directory under `name`; ValueError says what is wrong with it."""
        self.core.add_adapter(name, path)

    def remove_adapter(self, name: str) -> None:
        """Unload an adapter; refused (ValueError) while requests use it."""
        self.core.remove_adapter(name)

    def list_adapters(self) -> list[AdapterInfo]:
        return self.core.list_adapters()

    def close(self) -> None:
        """Stop the tensor-parallel ranks this engine spawned (a no-op for one process)."""
        self.core.close()

    def chat(self, conversations: list[dict[str, Any]] | list[list[dict[str, Any]]],
             params: SamplingParams | Sequence[SamplingParams] | None = None, **kwargs: Any) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts = [self.tokenizer.apply_chat_template(conv) for conv in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, params, **kwargs)

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="generating", disable=not use_tqdm)
        while self.core.has_unfinished():
            for out in self.core.step(delta=False, final_only=True):
                if out.finished:
                    done[out.request_id] = out
                    bar.update(1)
        bar.close()
        return [done[rid] for rid in order]
