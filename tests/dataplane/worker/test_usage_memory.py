"""The worker's memory of requests' token counts: live updates, bounds, expiry, waiting for the end."""

from __future__ import annotations

import asyncio
import time

from dataplane.worker.usage_memory import UsageMemory


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_counts_are_live_then_final():
    memory = UsageMemory()
    entry = memory.start("r1", prompt_tokens=12, num_prompts=2)
    entry.add(0, 4, 1)
    entry.add(1, 8, 2)
    entry.add(0, 4, 2)  # the engine reports a prompt's cache hits again with every delta: not summed
    assert memory.get("r1").as_json() == {"request_id": "r1", "state": "running", "status": "running",
                                          "prompt_tokens": 12, "cached_tokens": 12, "completion_tokens": 5}
    memory.finish(entry, "cancelled")
    memory.finish(entry, "ok")  # every path may finish it; the first one tells
    assert memory.get("r1").as_json()["state"] == "finished" and memory.get("r1").status == "cancelled"
    assert memory.get("nope") is None


def test_finished_entries_are_bounded_oldest_first():
    memory = UsageMemory(max_entries=3)
    for i in range(5):
        memory.finish(memory.start(f"r{i}", 1), "ok")
    running = memory.start("live", 1)  # running requests are never evicted
    assert [rid for rid in ("r0", "r1", "r2", "r3", "r4") if memory.get(rid)] == ["r2", "r3", "r4"]
    assert memory.get("live") is running and len(memory) == 4


def test_finished_entries_expire():
    clock = Clock()
    memory = UsageMemory(max_age=60, clock=clock)
    memory.finish(memory.start("old", 1), "ok")
    clock.now += 30
    memory.finish(memory.start("new", 1), "ok")
    long_running = memory.start("long", 1)
    clock.now += 31
    assert memory.get("old") is None and memory.get("new") is not None
    assert memory.get("long") is long_running  # 61 s running: its clock starts when it finishes
    clock.now += 30
    assert memory.get("new") is None and len(memory) == 1


def test_the_later_of_two_requests_under_one_id_is_remembered():
    memory = UsageMemory()
    first, second = memory.start("dup", 1), memory.start("dup", 2)
    assert memory.get("dup") is second
    memory.finish(second, "ok")
    memory.finish(first, "cancelled")  # the earlier one ends last: it does not overwrite the later
    assert memory.get("dup") is second


async def test_wait_wakes_when_the_request_finishes():
    memory = UsageMemory()
    entry = memory.start("r1", 5)

    async def finish_soon() -> None:
        await asyncio.sleep(0.05)
        entry.add(0, 0, 7)
        memory.finish(entry, "cancelled")

    task = asyncio.ensure_future(finish_soon())
    began = time.monotonic()
    got = await memory.wait("r1", 5)
    assert time.monotonic() - began < 1
    assert got.as_json() == {"request_id": "r1", "state": "finished", "status": "cancelled", "prompt_tokens": 5,
                             "cached_tokens": 0, "completion_tokens": 7}
    await task


async def test_wait_times_out_on_a_running_request_and_answers_at_once_otherwise():
    memory = UsageMemory()
    memory.start("r1", 5)
    began = time.monotonic()
    got = await memory.wait("r1", 0.1)
    assert 0.09 <= time.monotonic() - began < 1 and got.state == "running"
    began = time.monotonic()
    assert await memory.wait("unknown", 5) is None
    memory.finish(memory.start("done", 1), "ok")
    assert (await memory.wait("done", 5)).state == "finished"
    assert time.monotonic() - began < 0.1
