"""Grammar compile deadline: a schema that compiles for too long is refused (ValueError naming its field,
a 400 from the worker), the child compiling it is killed, and other requests are served after it."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from dataplane import LLM, SamplingParams
from dataplane.config import CacheConfig, ModelConfig
from dataplane.engine.async_llm import AsyncLLM
from dataplane.errors import QueueFullError
from dataplane.structured.compile_process import CompileBusy, CompilePool, CompileTimeout
from dataplane.structured.params import StructuredOutputs
from dataplane.worker.config import WorkerConfig
from dataplane.worker.routes import WorkerState, create_app
from tests.dataplane.conftest import MODEL

# Nested bounded repetitions in patterns compile slowly with SmolLM2's vocabulary: this schema takes
# ~17-18 s with xgrammar 0.2.8 and 0.2.9 on an AVX-512 EPYC, far past the tests' 0.5 s deadline. (Forty
# strings with their own maxLength took ~20 s with 0.2.8; 0.2.9 compiles them in 0.02 s.)
SLOW = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": f"^([a-z]{{2,{9 + i % 7}}}[0-9]){{3,{40 + i}}}$"}
                                         for i in range(40)}}
DEADLINE = 0.5


@pytest.fixture(scope="module")
def llm(smollm_fp32):
    return LLM(MODEL, dtype="float32", preloaded=smollm_fp32, kv_cache_memory="64MiB",
               grammar_compile_timeout=DEADLINE)


def test_a_slow_grammar_is_refused_at_the_deadline_and_its_compiler_killed(llm):
    backend = llm.core.structured
    backend.compile(StructuredOutputs(json_object=True))  # starts the child outside the measured time
    spec = StructuredOutputs(json=SLOW, source="response_format")
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"^response_format: the JSON schema did not compile within {DEADLINE:g} s"):
        llm.generate("Hi", SamplingParams(max_tokens=4, structured=spec))
    assert time.monotonic() - start < DEADLINE + 3  # the deadline, not the ~20 s compile
    assert backend._pool.num_killed == 1 and not llm.core.scheduler.waiting
    # The next structured request gets a fresh child and its own deadline.
    out = llm.generate("Hi", SamplingParams(max_tokens=8, temperature=0,
                                            structured=StructuredOutputs(choice=["yes", "no"])))[0]
    assert out.outputs[0].text in ("yes", "no")


def test_a_busy_compiler_is_a_queue_full_error_and_errors_keep_their_messages(llm):
    pool = CompilePool(llm.core.structured._get_info().serialize_json(), size=1)
    try:
        pool.compile("regex", "a", timeout=30, wait=60)  # started
        errors: list[BaseException] = []

        def slow() -> None:
            try:
                pool.compile("json", StructuredOutputs(json=SLOW).json or "", timeout=2, wait=1)
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
                errors.append(exc)

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.3)
        with pytest.raises(CompileBusy) as busy:
            pool.compile("regex", "b", timeout=30, wait=0.2)
        assert isinstance(busy.value, QueueFullError)  # the worker answers 429 with Retry-After
        t.join()
        assert len(errors) == 1 and isinstance(errors[0], CompileTimeout) and pool.num_killed == 1
        pool.compile("regex", "b", timeout=30, wait=60)  # a new child after the kill
    finally:
        pool.close()


async def test_the_worker_answers_a_slow_schema_with_a_400_naming_the_field(smollm_fp32):
    engine = AsyncLLM(ModelConfig(MODEL, dtype="float32"), CacheConfig(kv_cache_memory="32MiB"), progress=False,
                      preloaded=smollm_fp32, grammar_compile_timeout=DEADLINE)
    try:
        state = WorkerState(WorkerConfig(model="fake"), engine)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://w") as c:
            body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "slow", "schema": SLOW}}}
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", "response_format",
                                                                 "invalid_value")
            assert f"did not compile within {DEADLINE:g} s" in err["message"]
            body["response_format"] = {"type": "json_object"}
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
    finally:
        engine.shutdown()
