"""common/single_flight.py: callers asking together share one call; leaving, failing and the next call."""

from __future__ import annotations

import asyncio

import pytest

from common.single_flight import SingleFlight


class Counted:
    def __init__(self, result=42, error: Exception | None = None) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.result, self.error = result, error

    async def __call__(self):
        self.calls += 1
        await self.release.wait()
        if self.error is not None:
            raise self.error
        return self.result


async def test_callers_asking_together_share_one_call_and_the_next_call_runs_again():
    flight, call = SingleFlight(), Counted()
    waiters = [asyncio.create_task(flight.run("k", call)) for _ in range(16)]
    await asyncio.sleep(0.01)  # the callers and the call have started
    assert call.calls == 1 and flight.in_flight() == 1
    call.release.set()
    assert await asyncio.gather(*waiters) == [42] * 16
    assert flight.in_flight() == 0
    assert await flight.run("k", call) == 42
    assert call.calls == 2  # done: a later caller asks again (nothing is cached here)


async def test_different_keys_are_different_calls():
    flight, a, b = SingleFlight(), Counted("a"), Counted("b")
    first, second = asyncio.create_task(flight.run("a", a)), asyncio.create_task(flight.run("b", b))
    await asyncio.sleep(0.01)  # the callers and the call have started
    a.release.set()
    b.release.set()
    assert await asyncio.gather(first, second) == ["a", "b"]
    assert (a.calls, b.calls) == (1, 1)


async def test_a_joining_caller_that_leaves_does_not_cancel_the_call():
    flight, call = SingleFlight(), Counted()
    running = asyncio.create_task(flight.run("k", call))
    await asyncio.sleep(0.01)  # the first caller runs the call
    leaving, staying = asyncio.create_task(flight.run("k", call)), asyncio.create_task(flight.run("k", call))
    await asyncio.sleep(0.01)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    call.release.set()
    assert await asyncio.gather(running, staying) == [42, 42]
    assert call.calls == 1


async def test_when_the_caller_running_it_leaves_the_others_ask_again():
    flight, call = SingleFlight(), Counted()
    leader = asyncio.create_task(flight.run("k", call))
    await asyncio.sleep(0.01)
    others = [asyncio.create_task(flight.run("k", call)) for _ in range(3)]
    await asyncio.sleep(0.01)
    leader.cancel()  # its client left: its call stops with it
    with pytest.raises(asyncio.CancelledError):
        await leader
    await asyncio.sleep(0.01)
    assert call.calls == 2 and flight.in_flight() == 1  # one of the others runs it again, alone
    call.release.set()
    assert await asyncio.gather(*others) == [42] * 3
    assert flight.in_flight() == 0


async def test_a_lone_call_is_run_by_its_caller_with_no_task_in_between():
    """The first caller awaits the call itself: no task is scheduled for it (a turn of a busy loop)."""
    flight = SingleFlight()
    seen = {}

    async def call():
        seen["task"] = asyncio.current_task()
        return 1

    mine = asyncio.create_task(flight.run("k", call))
    assert await mine == 1
    assert seen["task"] is mine


async def test_a_failure_reaches_every_caller_and_is_not_kept():
    flight, call = SingleFlight(), Counted(error=ConnectionError("database gone"))
    waiters = [asyncio.create_task(flight.run("k", call)) for _ in range(4)]
    await asyncio.sleep(0.01)  # the callers and the call have started
    call.release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    call.error = None
    assert await flight.run("k", call) == 42  # the next caller tries again


def test_each_event_loop_has_its_own_call():
    flight = SingleFlight()

    async def once() -> int:
        return await flight.run("k", lambda: asyncio.sleep(0, result=7))

    assert asyncio.run(once()) == 7
    assert asyncio.run(once()) == 7  # a new loop (maybe the same id as the closed one): a new call
    assert flight.in_flight() == 0


async def test_a_lone_failure_is_not_logged_as_never_retrieved(caplog):
    import gc
    import logging

    flight = SingleFlight()

    async def failing():
        raise ConnectionError("database gone")

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(ConnectionError):
            await flight.run("k", failing)
        gc.collect()
        await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text
