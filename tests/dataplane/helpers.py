"""Drive the scheduler with no model: schedule, hand-build the runner's output, update."""

from __future__ import annotations

from dataplane.config import SchedulerConfig
from dataplane.kv_cache.manager import KVCacheManager
from dataplane.request import Request
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler.output import ModelRunnerOutput, SchedulerOutput
from dataplane.scheduler.scheduler import Scheduler

EOS = 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 1024, caching: bool = True,
                   clock: FakeClock | None = None, **cfg: object) -> Scheduler:
    config = SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 64, **cfg})  # type: ignore[arg-type]
    return Scheduler(config, KVCacheManager(num_blocks, block_size, caching), max_model_len,
                     clock=clock or FakeClock())


def make_request(rid: str, prompt_len: int = 10, max_tokens: int = 4, priority: int = 0, first_token: int = 100,
                 clock: FakeClock | None = None, **kw: object) -> Request:
    req = Request(rid, list(range(first_token, first_token + prompt_len)), SamplingParams(max_tokens=max_tokens),
                  (EOS,), priority, **kw)  # type: ignore[arg-type]
    if clock is not None:
        req.times.arrival = clock.now
    return req


def sampled(sched: Scheduler, out: SchedulerOutput, token: int = 7) -> ModelRunnerOutput:
    """The runner's output for `out`: every request that reaches the end of its known tokens samples `token`."""
    result = ModelRunnerOutput()
    for rid, n in out.num_scheduled_tokens.items():
        req = sched.requests[rid]
        if req.num_computed_tokens + n == req.num_tokens:
            result.sampled_token_ids[rid] = [token]
    return result


def run_step(sched: Scheduler, token: int = 7) -> tuple[SchedulerOutput, list]:
    """One engine step where every request that reaches the end of its known tokens samples `token`."""
    out = sched.schedule()
    return out, sched.update(out, sampled(sched, out, token))


def assert_no_leaks(sched: Scheduler) -> None:
    pool = sched.kv.pool
    assert pool.num_free == pool.num_blocks, f"{pool.num_blocks - pool.num_free} blocks still held"
    assert all(b.ref_cnt == 0 for b in pool.blocks)
    assert not sched.kv.req_blocks
