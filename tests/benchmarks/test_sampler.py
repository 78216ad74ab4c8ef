"""benchmarks.sampler: its workloads reach the draws they name, and it times each."""

from __future__ import annotations

from benchmarks import sampler


def test_each_workload_takes_the_draw_it_names():
    import torch

    from dataplane.sampling.sampler import Sampler

    gen = torch.Generator().manual_seed(0)
    for workload, candidates in (("temperature", False), ("top_p", False), ("flat top_p", False),
                                 ("top_k + top_p", True)):
        batch = sampler._batch(workload, 4)
        tokens, _ = Sampler().sample_tensor(sampler._logits(4, 1000, workload == "flat top_p", gen), batch)
        assert batch.plan.candidates is candidates and len(batch.plan.seeded) == 2
        assert tokens.shape == (4,) and int(tokens.max()) < 1000


def test_measure_times_every_workload_at_every_batch():
    got = sampler.measure([1, 3], 2000, 2)
    assert set(got) == set(sampler.WORKLOADS)
    assert all(set(per) == {"1", "3"} and all(ms > 0 for ms in per.values()) for per in got.values())
