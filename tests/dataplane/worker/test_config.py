from __future__ import annotations

import pytest

from dataplane.worker.config import load_config


def test_flags_over_environment_over_defaults():
    env = {"TESSERA_WORKER_MODEL": "m", "TESSERA_WORKER_PORT": "9000", "TESSERA_WORKER_TOKEN": "t",
           "TESSERA_WORKER_ENABLE_PREFIX_CACHING": "false", "TESSERA_WORKER_MAX_MODEL_LEN": "none"}
    c = load_config(["--port", "9001", "--drain-timeout", "2.5"], env)
    assert (c.model, c.port, c.token, c.drain_timeout, c.host) == ("m", 9001, "t", 2.5, "127.0.0.1")
    assert c.enable_prefix_caching is False and c.max_model_len is None
    assert load_config(["--model", "x", "--no-enable-prefix-caching"], {}).enable_prefix_caching is False
    assert load_config(["--model", "x", "--max-model-len", "512"], {}).engine_kwargs()["max_model_len"] == 512
    guard = load_config(["--model", "x", "--itl-guard-priority", "10", "--itl-guard-step-tokens", "16"], {})
    assert (guard.engine_kwargs()["itl_guard_priority"], guard.engine_kwargs()["itl_guard_step_tokens"]) == (10, 16)


@pytest.mark.parametrize("argv,env,field", [
    ([], {}, "model"),
    (["--model", "m", "--max-waiting", "-1"], {}, "max_waiting"),
    (["--model", "m", "--max-waiting", "0"], {}, "max_waiting"),
    (["--model", "m", "--threads", "0"], {}, "threads"),
    (["--model", "m", "--itl-guard-step-tokens", "0"], {}, "itl_guard_step_tokens"),
    (["--model", "m", "--kv-cache-memory", "lots"], {}, "kv_cache_memory"),
    (["--model", "m"], {"TESSERA_WORKER_PORT": "eighty"}, "port"),
    (["--model", "m"], {"TESSERA_WORKER_ENABLE_PREFIX_CACHING": "maybe"}, "enable_prefix_caching"),
    (["--model", "m", "--usage-memory-entries", "0"], {}, "usage_memory_entries"),
    (["--model", "m"], {"TESSERA_WORKER_USAGE_MEMORY_SECONDS": "0"}, "usage_memory_seconds"),
])
def test_bad_settings_name_the_field(argv, env, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        load_config(argv, env)


def test_usage_memory_bounds_reach_the_worker_state():
    from dataplane.worker.routes import WorkerState

    c = load_config(["--model", "x", "--usage-memory-entries", "500"], {"TESSERA_WORKER_USAGE_MEMORY_SECONDS": "90.5"})
    usage = WorkerState(c).usage
    assert (usage.max_entries, usage.max_age) == (500, 90.5)
    defaults = load_config(["--model", "x"], {})
    assert (defaults.usage_memory_entries, defaults.usage_memory_seconds) == (100_000, 3600.0)


def test_weight_dtype_reaches_the_engine_config():
    from dataplane.engine.async_llm import AsyncLLM

    c = load_config(["--model", "x", "--dtype", "float32", "--weight-dtype", "float16"], {})
    assert c.engine_kwargs()["weight_dtype"] == "float16"
    assert load_config(["--model", "x"], {"TESSERA_WORKER_WEIGHT_DTYPE": "float32"}).weight_dtype == "float32"
    # AsyncLLM hands it to ModelConfig, which refuses a combination it cannot run before any load.
    with pytest.raises(ValueError, match="^weight_dtype: float16 weights under bfloat16"):
        AsyncLLM.from_args("x", **{**c.engine_kwargs(), "dtype": "bfloat16"})


def test_grammar_compile_deadline_reaches_the_engine():
    assert load_config(["--model", "x"], {}).engine_kwargs()["grammar_compile_timeout"] == 10.0
    assert load_config(["--model", "x", "--grammar-compile-timeout", "2.5"], {}).engine_kwargs()["grammar_compile_timeout"] == 2.5
    off = load_config(["--model", "x"], {"TESSERA_WORKER_GRAMMAR_COMPILE_TIMEOUT": "0"})
    assert off.engine_kwargs()["grammar_compile_timeout"] is None  # 0: compiled in-process, no deadline
    with pytest.raises(ValueError, match="grammar_compile_timeout"):
        load_config(["--model", "x", "--grammar-compile-timeout", "-1"], {})


def test_quantization_reaches_the_engine_and_is_checked_at_start():
    c = load_config(["--model", "x", "--quantization", "gguf", "--int4-dense-above", "8"], {})
    assert (c.engine_kwargs()["quantization"], c.engine_kwargs()["int4_dense_above"]) == ("gguf", 8)
    assert "quantization" not in load_config(["--model", "x"], {}).engine_kwargs()  # the checkpoint's own
    assert load_config(["--model", "x"], {"TESSERA_WORKER_QUANTIZATION": "gguf"}).quantization == "gguf"
    with pytest.raises(ValueError, match="^quantization: 'q3' is not supported"):
        load_config(["--model", "x", "--quantization", "q3"], {})
    with pytest.raises(ValueError, match="int4_dense_above"):
        load_config(["--model", "x", "--int4-dense-above", "-1"], {})
