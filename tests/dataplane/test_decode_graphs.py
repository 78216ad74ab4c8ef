"""The graph-safe decode step (runner/decode_graphs.py) on the CPU: the padded step from persistent
buffers that a CUDA graph replays on a GPU, run eagerly here (`cuda_graphs="padded"`). It must give the
unpadded step's outputs, and its padding rows must never touch a request's KV blocks."""

from __future__ import annotations

import pytest

from dataplane import LLM, SamplingParams
from dataplane.runner.decode_graphs import capture_sizes
from tests.dataplane.lora_helpers import TINY, write_adapter
from tests.dataplane.quant.tiny import loaded, tiny_args, tiny_tensors

# Lengths that finish at different steps, so a step's batch shrinks across the captured sizes
# (7 -> 8 rows, 5 -> 8, 3 -> 4, 1 -> 1) and rows a larger step wrote become padding again.
MAX_TOKENS = [3, 9, 14, 20, 20, 6, 11]


@pytest.fixture(scope="module")
def tiny():
    args = tiny_args()
    return loaded(args, tiny_tensors(args, seed=5))


def _engine(model, mode: str, **kw) -> LLM:
    return LLM("tiny", dtype="float32", preloaded=model, block_size=4, max_num_seqs=16, max_num_batched_tokens=64,
               kv_cache_memory="1MiB", cuda_graphs=mode, **kw)


def _prompts() -> list[list[int]]:
    return [[2 + (7 * i + 3 * j) % 90 for j in range(3 + 2 * i)] for i in range(len(MAX_TOKENS))]


def _params() -> list[SamplingParams]:
    out = []
    for i, n in enumerate(MAX_TOKENS):
        if i % 3 == 0:
            out.append(SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=2))
        elif i % 3 == 1:
            out.append(SamplingParams(max_tokens=n, temperature=0.9, top_p=0.9, seed=100 + i, ignore_eos=True,
                                      logprobs=1))
        else:
            out.append(SamplingParams(max_tokens=n, temperature=0.7, top_k=5, seed=7 * i, ignore_eos=True,
                                      logprobs=0))
    return out


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(16) == [1, 2, 4, 8, 16]
    assert capture_sizes(100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]


def test_padded_step_gives_the_unpadded_outputs(tiny):
    eager = _engine(tiny, "off").generate(_prompts(), _params())
    padded_llm = _engine(tiny, "padded")
    padded = padded_llm.generate(_prompts(), _params())
    graphs = padded_llm.core.runner.graphs
    assert graphs is not None and graphs.stats.replays >= 15  # the decode steps went through the padded path
    for want, got in zip(eager, padded, strict=True):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        for a, b in zip(want.outputs[0].logprobs, got.outputs[0].logprobs, strict=True):
            assert b.token_id == a.token_id
            assert b.logprob == pytest.approx(a.logprob, abs=1e-5)
            assert [t for t, _ in b.top] == [t for t, _ in a.top]


class _ReplayedForward:
    """What a CUDA graph does, on the CPU: replay reruns the captured forward on the buffers as they are now,
    into the output tensor the capture returned."""

    def __init__(self, graphs, p: int, with_lora: bool) -> None:  # noqa: ANN001
        self.graphs, self.p, self.with_lora = graphs, p, with_lora

    def replay(self) -> None:
        out = self.graphs._graphs[(self.p, self.with_lora)][1]
        out.copy_(self.graphs._forward(self.p, self.with_lora))


def test_a_size_captured_on_first_use_replays_that_steps_rows(tiny, monkeypatch):
    """No warm-up capture (an offline LLM): the first step at each padded size captures it, and a capture
    runs the forward on padding rows. Captured after the step's rows went in, it wiped them, and that step
    replayed padding (wrong tokens once per size). Simulated: the capture's forward on padding, then a
    replay that recomputes from the buffers."""
    from dataplane.runner.decode_graphs import DecodeGraphs

    def capture(self, p, with_lora):  # noqa: ANN001, ANN202
        self._fill_padding(p)
        out = self._forward(p, with_lora).clone()  # the capture's own run: on padding rows
        self._graphs[(p, with_lora)] = (_ReplayedForward(self, p, with_lora), out)
        self.stats.graphs = len(self._graphs)

    monkeypatch.setattr(DecodeGraphs, "_capture", capture)
    eager = _engine(tiny, "off").generate(_prompts(), _params())
    llm = _engine(tiny, "padded")
    llm.core.runner.graphs.mode = "cuda"  # captures and replays, through the simulation
    got = llm.generate(_prompts(), _params())
    graphs = llm.core.runner.graphs
    assert graphs.stats.graphs >= 3 and graphs.stats.replays >= 15
    for want, have in zip(eager, got, strict=True):
        assert have.outputs[0].token_ids == want.outputs[0].token_ids


def test_padding_rows_touch_only_the_dummy_block(tiny):
    llm = _engine(tiny, "padded")
    core = llm.core
    for i, (prompt, params) in enumerate(zip(_prompts()[:3], _params()[:3], strict=True)):  # 3 rows -> size 4
        rid, text, children = core.make_requests(prompt, params, request_id=f"r{i}")
        core.add(rid, text, children)
    while any(r.num_output_tokens == 0 for r in core.scheduler.running) or core.scheduler.waiting:
        core.step()
    runner = core.runner
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    written = set()  # the slots this step's real rows write: position num_computed of each
    for req in core.scheduler.running:
        blocks = core.scheduler.kv.block_ids(req.request_id)
        pos = req.num_computed_tokens
        written.add(blocks[pos // 4] * 4 + pos % 4)
    replays = runner.graphs.stats.replays
    core.step()
    assert runner.graphs.stats.replays == replays + 1 and len(written) == 3  # a padded step of 3 rows in 4
    dummy = runner.dummy_block
    for (k0, v0), (k1, v1) in zip(before, runner.kv_caches, strict=True):
        for cache0, cache1 in ((k0, k1), (v0, v1)):
            changed = (cache0 != cache1).flatten(2).any(-1).nonzero().tolist()  # (block, offset) pairs
            slots = {b * 4 + o for b, o in changed}
            assert slots - written <= {dummy * 4}, "a padding row wrote outside the dummy block"
            assert slots & written  # the real rows did write


def test_padded_step_with_mixed_lora_adapters(tmp_path):
    args = TINY
    model = loaded(args, tiny_tensors(args, seed=9))
    paths = []
    for i in range(3):
        write_adapter(tmp_path / f"a{i}", args, 4, ("q_proj", "v_proj", "down_proj"), seed=20 + i)
        paths.append(str(tmp_path / f"a{i}"))
    prompts = [[3 + (5 * i + j) % 60 for j in range(4 + i)] for i in range(6)]
    prompts[1] = prompts[0]  # the same prompt on the base model and on a0
    adapters = [None, "a0", "a1", None, "a2", "a0"]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
    outs = {}
    for mode in ("off", "padded"):
        llm = LLM("tiny", dtype="float32", preloaded=model, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                  kv_cache_memory="1MiB", enable_lora=True, max_loras=4, max_lora_rank=8, cuda_graphs=mode)
        for i, p in enumerate(paths):
            llm.add_adapter(f"a{i}", p)
        outs[mode] = llm.generate(prompts, params, adapters=adapters)
        if mode == "padded":
            assert llm.core.runner.graphs.stats.replays > 0
    for want, got in zip(outs["off"], outs["padded"], strict=True):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        for a, b in zip(want.outputs[0].logprobs, got.outputs[0].logprobs, strict=True):
            assert b.logprob == pytest.approx(a.logprob, abs=1e-4)
    # The adapter changed the answer: a test of LoRA under padding, not of the base model alone.
    assert outs["padded"][1].outputs[0].token_ids != outs["padded"][0].outputs[0].token_ids


def test_cuda_mode_needs_a_cuda_device(tiny):
    with pytest.raises(ValueError, match="cuda_graphs"):
        _engine(tiny, "cuda")
    with pytest.raises(ValueError, match="cuda_graphs"):
        _engine(tiny, "sometimes")


def test_auto_is_eager_on_the_cpu(tiny):
    assert _engine(tiny, "auto").core.runner.graphs is None


def test_worker_flags_and_metrics():
    from dataplane.stats import SchedulerStats
    from dataplane.worker.config import WorkerConfig
    from dataplane.worker.metrics import EngineCollector

    assert WorkerConfig(model="m").engine_kwargs()["cuda_graphs"] == "auto"
    kwargs = WorkerConfig(model="m", device="cuda", enforce_eager=True).engine_kwargs()
    assert (kwargs["device"], kwargs["cuda_graphs"]) == ("cuda", "off")
    stats = SchedulerStats(0, 0, 0.0, 0, 0, 0, 0, 0, 10, 10, cuda_graphs=35, cuda_graph_capture_seconds=4.5,
                           cuda_graph_memory_bytes=2**20, cuda_graph_replays=7)
    samples = {s.name: s.value for family in EngineCollector("m", lambda: stats).collect() for s in family.samples}
    assert samples["tessera:cuda_graph_count"] == 35 and samples["tessera:cuda_graph_memory_bytes"] == 2**20
    assert samples["tessera:cuda_graph_capture_seconds"] == 4.5 and samples["tessera:cuda_graph_replays_total"] == 7
