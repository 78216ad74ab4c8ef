"""Tensor parallelism with real processes: three gloo ranks on this CPU against one process.

float32 throughout: the all-reduce sums three partial products in another order than one
process's matmul does, so bf16 could flip a near-tie in greedy decoding; float32 must not.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
import torch

from dataplane.distributed.shard import check_tensor_parallel_size, shard_args, shard_weights
from dataplane.engine.llm import LLM
from dataplane.models.loader import LoadedModel, read_weights
from dataplane.models.registry import resolve_model_path
from dataplane.sampling_params import SamplingParams
from tests.dataplane.conftest import MODEL, PROMPTS

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tp3():
    llm = LLM(MODEL, dtype="float32", kv_cache_memory="64MiB", tensor_parallel_size=3)
    yield llm
    llm.close()


@pytest.mark.slow
def test_tp3_greedy_matches_one_process(tp3: LLM, smollm_fp32: LoadedModel) -> None:
    """8 prompts of 2 to ~300 tokens in one batch (chunked prefill beside decodes), 16 tokens each."""
    one = LLM(MODEL, dtype="float32", kv_cache_memory="64MiB", preloaded=smollm_fp32)
    expected = [o.outputs[0].token_ids for o in one.generate(PROMPTS, GREEDY)]
    got = [o.outputs[0].token_ids for o in tp3.generate(PROMPTS, GREEDY)]
    assert got == expected
    assert all(len(ids) == 16 for ids in got)
    # Each rank keeps a third of the heads: rank 0's model and its KV cache are the shard's.
    assert tp3.core.model.args.num_heads == 3 and tp3.core.model.args.num_kv_heads == 1
    assert tp3.core.runner.kv_caches[0][0].shape[2] == 1


@pytest.mark.slow
def test_tp3_decode_graph_steps_match_one_process(tp3: LLM, smollm_fp32: LoadedModel) -> None:
    """Decode graphs on every rank (mode "padded": the padded step from persistent buffers, what a GPU
    replays as a CUDA graph per rank): rank 0 tells the followers each decode step's rows
    (distributed/messages.GraphStep) and each rank runs its own padded step, the all-reduces pairing up.
    Prompts of 2 to ~300 tokens finish at different lengths, so the padded size shrinks as rows leave.
    (One tensor parallel engine per process: the module's engine is switched to graphs, then back.)"""
    lengths = [16, 3, 9, 12, 5, 16, 7, 11]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
    one = LLM(MODEL, dtype="float32", kv_cache_memory="64MiB", preloaded=smollm_fp32)
    expected = [o.outputs[0].token_ids for o in one.generate(PROMPTS, params)]
    runner = tp3.core.runner
    assert runner.graphs is None  # "auto" keeps a tensor parallel engine eager
    graphs = runner.use_graphs("padded", 8)
    try:
        assert graphs.peers is not None
        broadcasts = tp3.core.model.comm.broadcasts
        got = [o.outputs[0].token_ids for o in tp3.generate(PROMPTS, params)]
        assert got == expected
        assert graphs.stats.replays >= 10 and graphs.stats.eager_steps == 0  # decodes went through the ranks' padded steps
        # one message a step whichever kind: Step for the prefill steps, GraphStep for the decodes
        assert tp3.core.model.comm.broadcasts - broadcasts > graphs.stats.replays
    finally:
        runner.graphs = None
    assert [o.outputs[0].token_ids for o in tp3.generate(PROMPTS[:2], params[:2])] == expected[:2]  # eager again


def test_a_tensor_parallel_engine_runs_graphs_when_asked() -> None:
    from dataplane.config import ModelConfig

    for asked, device, want in (("auto", "cpu", None), ("auto", "cuda", None), ("padded", "cpu", "padded"),
                                ("cuda", "cuda", "cuda"), ("off", "cuda", None)):
        assert ModelConfig(MODEL, device=device, tensor_parallel_size=3, cuda_graphs=asked).graph_mode == want
    assert ModelConfig(MODEL, device="cuda", cuda_graphs="auto").graph_mode == "cuda"


@pytest.mark.slow
def test_tp3_batches_arriving_one_by_one_match(tp3: LLM, smollm_fp32: LoadedModel) -> None:
    """A second call reuses the ranks' caches (prefix hits on rank 0's block ids must hold on every rank)."""
    one = LLM(MODEL, dtype="float32", kv_cache_memory="64MiB", preloaded=smollm_fp32)
    short = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for p in (PROMPTS[4], PROMPTS[5]):  # they share a long prefix: the second hits the first's blocks
        assert tp3.generate(p, short)[0].outputs[0].token_ids == one.generate(p, short)[0].outputs[0].token_ids
    assert tp3.core.scheduler.stats().prefix_cache_hits > 0


def test_tp2_is_refused_naming_the_head_counts() -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 2 does not divide the model's 9 attention heads "
                                         r"and 3 key/value heads.*sizes that fit: 1, 3"):
        LLM(MODEL, dtype="float32", tensor_parallel_size=2)


def test_shards_rebuild_the_full_weights() -> None:
    args, tensors = read_weights(resolve_model_path(MODEL), progress=False)
    shards = [shard_weights(args, tensors, r, 3) for r in range(3)]
    for name, dim in (("model.layers.0.self_attn.q_proj.weight", 0), ("model.layers.0.self_attn.k_proj.weight", 0),
                      ("model.layers.0.mlp.up_proj.weight", 0), ("model.layers.0.self_attn.o_proj.weight", 1),
                      ("model.layers.0.mlp.down_proj.weight", 1)):
        assert torch.equal(torch.cat([s[name] for s in shards], dim=dim), tensors[name])
        assert shards[1][name].shape[dim] * 3 == tensors[name].shape[dim]
    assert shards[2]["model.embed_tokens.weight"] is tensors["model.embed_tokens.weight"]  # replicated
    a = shard_args(args, 3)
    assert (a.num_heads, a.num_kv_heads, a.intermediate_size) == (3, 1, args.intermediate_size // 3)
    with pytest.raises(ValueError, match="intermediate size"):
        check_tensor_parallel_size(dataclasses.replace(args, intermediate_size=1537), 3)


@pytest.mark.slow
def test_a_worker_serves_with_three_ranks_and_stops_them(tp3: LLM) -> None:
    """The real worker process with --tensor-parallel-size 3: one completion over HTTP equal to the
    offline TP engine's, and its two follower processes gone after SIGTERM."""
    import httpx

    from tests.dataplane.worker.process import running

    expected = tp3.generate("The capital of France is", GREEDY)[0].outputs[0].text
    with running("--tensor-parallel-size", "3", "--dtype", "float32", "--kv-cache-memory", "64MiB") as worker:
        body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0,
                "ignore_eos": True}
        answer = httpx.post(worker.url + "/v1/completions", json=body, headers=worker.headers, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == expected
        followers = _children(worker.proc.pid)
        assert len(followers) == 2
    assert not [pid for pid in followers if _alive(pid)]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_followers_exit_when_rank_0_is_killed() -> None:
    """SIGKILL leaves no chance to tell them: the closed gloo connection (or, outside a collective, the
    parent watchdog) must end them."""
    import subprocess
    import sys

    script = ("from dataplane.engine.llm import LLM\n"
              f"llm = LLM({MODEL!r}, dtype='float32', kv_cache_memory='32MiB', tensor_parallel_size=3)\n"
              "print(*[f.proc.pid for f in llm.core.model.procs], flush=True)\n"
              "import time; time.sleep(120)\n")
    rank0 = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        followers = [int(pid) for pid in rank0.stdout.readline().split()]
        assert len(followers) == 2 and all(os.path.exists(f"/proc/{pid}") for pid in followers)
    finally:
        rank0.kill()
        rank0.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for pid in followers):
        time.sleep(0.2)
    assert not [pid for pid in followers if _alive(pid)]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_dead_rank_fails_the_engine_loudly(tp3: LLM) -> None:
    """Last in this module: it kills rank 2. The step fails with the rank's exit, not a hang."""
    follower = tp3.core.model.procs[1]
    os.kill(follower.proc.pid, signal.SIGKILL)
    follower.proc.wait(10)
    start = time.monotonic()
    out = tp3.generate("The capital of France is", GREEDY)[0].outputs[0]
    assert time.monotonic() - start < 30
    assert out.finish_reason == "error"
    assert "tensor parallel rank 2 exited (code -9)" in out.error


def test_the_worker_flag_and_its_environment_variable_reach_the_engine_config() -> None:
    from dataplane.worker.config import load_config

    assert load_config(["--model", MODEL, "--tensor-parallel-size", "3"], env={}).engine_kwargs()[
        "tensor_parallel_size"] == 3
    assert load_config(["--model", MODEL], env={"TESSERA_WORKER_TENSOR_PARALLEL_SIZE": "3"}).tensor_parallel_size == 3
    with pytest.raises(ValueError, match="tensor_parallel_size: must be >= 1"):
        load_config(["--model", MODEL, "--tensor-parallel-size", "0"], env={})
