"""Shared helpers for benchmark scripts: percentiles, memory bandwidth, JSON + markdown output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def measure_bandwidth_gbs(mib: int = 512, repeats: int = 5) -> float:
    """Read bandwidth from summing a large tensor (the best of a few runs)."""
    x = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def environment() -> dict[str, Any]:
    # The CPU's name and vector extensions: ratios move with them (bf16 is native with AVX-512 BF16
    # and emulated on AVX2, where a batch-32 bf16 step ran 4x slower than float32).
    from dataplane.config import cpu_has_native_bf16

    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "cpu": _cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_has_native_bf16(), "when": time.strftime("%Y-%m-%d %H:%M:%S")}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return platform.processor() or "unknown"


def write_results(name: str, data: dict[str, Any], table: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    jpath = RESULTS / f"{name}.json"
    mpath = RESULTS / f"{name}.md"
    jpath.write_text(json.dumps(data, indent=2, default=str) + "\n")
    mpath.write_text(table + "\n")
    return jpath, mpath


def fmt(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def db_step_process(env: dict[str, str], step: str, **kwargs: Any) -> subprocess.Popen:
    """benchmarks.db_setup's `step` started in a child with `env` (the stack's database and settings);
    its one JSON line comes on the process's stdout."""
    return subprocess.Popen([sys.executable, "-m", "benchmarks.db_step", step, json.dumps(kwargs)], env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)


def db_step(env: dict[str, str], step: str, **kwargs: Any) -> Any:
    """benchmarks.db_setup's `step` run in a child with `env`, to its result."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.db_step", step, json.dumps(kwargs)], env=env, cwd=ROOT,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_child(target: str, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """`target` ("module:function") called with `kwargs` in a fresh process (benchmarks.child), to its result;
    `env` is added to this process's environment."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.child", target, json.dumps(kwargs)], cwd=ROOT,
                         env={**os.environ, **(env or {})}, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def stop_processes(procs: list[subprocess.Popen], timeout: float) -> None:
    """Terminate every process, then wait for each up to `timeout` s, killing one that has not exited."""
    for proc in procs:
        proc.terminate()  # a no-op for one that has already exited
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc): a load-independent cost measure."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def read_chat_stream(response, arrivals: list[float] | None = None) -> tuple[float | None, str, dict]:
    """(arrival of the first content, the text, the usage) of a streamed chat completion (an httpx response).

    `arrivals`, when given, receives the arrival time of every event that carried content: the
    inter-token latencies are their gaps (`ttft_and_gaps`).
    """
    first, text, usage = None, "", {}
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = orjson.loads(line[6:])
        if event.get("usage"):
            usage = event["usage"]
        pieces = "".join((choice.get("delta") or {}).get("content") or "" for choice in event.get("choices") or [])
        if pieces:
            now = time.perf_counter()
            if first is None:
                first = now
            if arrivals is not None:
                arrivals.append(now)
            text += pieces
    return first, text, usage


def ttft_and_gaps(start: float, arrivals: list[float]) -> tuple[float | None, list[float]]:
    """(time to first content, the gaps between content events), in ms, of a stream sent at `start`."""
    if not arrivals:
        return None, []
    return (arrivals[0] - start) * 1000, [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:], strict=False)]
