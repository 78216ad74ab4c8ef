"""A real worker process serving SmolLM2's own 4-bit blocks (--quantization gguf) through the C++ kernels."""

from __future__ import annotations

import openai
import pytest

from .process import MODEL, TOKEN, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_worker_serves_the_gguf_blocks_over_http():
    w = WorkerProcess("--dtype", "float32", "--quantization", "gguf")
    try:
        w.wait_ready()
        client = openai.OpenAI(base_url=w.url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)
        out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
        assert out.usage.completion_tokens == 8 and out.choices[0].text.strip()
        chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                                temperature=0, stream=True))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text
        assert "(gguf)" in w.logs()  # the loader says what it loaded
        assert w.metrics()["tessera:generation_tokens_total"] >= 16
    finally:
        w.stop()
