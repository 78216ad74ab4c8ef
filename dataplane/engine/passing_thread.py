"""Torch work beside the engine thread runs on a thread that exits when it is done.

libgomp, the OpenMP of torch's CPU builds, keeps a pool of worker threads for every thread that ever
ran a parallel region, and frees it only when that thread exits. Once it manages more threads than
the machine has CPUs it "throttles": at each barrier a waiting thread spins ~100 times instead of
300,000 before it sleeps, so each of a decode step's hundreds of parallel regions pays a futex
wake-up. A model loaded on an executor thread that lives on (`asyncio.to_thread`) and stepped on the
engine thread decoded at half speed: 44.7 against 83.0 tok/s at batch 1 (SmolLM2, bf16, 2 threads,
AMD EPYC with AVX-512 BF16); loaded on a thread that then exits, 83.1.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def call_in_passing_thread(fn: Callable[..., T], *args: Any, thread_name: str = "tessera-passing", **kwargs: Any) -> T:
    """fn(*args, **kwargs) on a new thread, which has exited (and its OpenMP pool with it) on return."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            box["error"] = exc

    thread = threading.Thread(target=run, name=thread_name, daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


async def in_passing_thread(fn: Callable[..., T], *args: Any, thread_name: str = "tessera-passing", **kwargs: Any) -> T:
    """The same, awaited: the executor thread only waits for the passing one, running no torch itself."""
    return await asyncio.to_thread(call_in_passing_thread, fn, *args, thread_name=thread_name, **kwargs)
