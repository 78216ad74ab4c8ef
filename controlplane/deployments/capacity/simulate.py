"""One replica under a steady load, simulated step by step with its measured step costs.

Why a simulation and not a formula: with continuous batching a step's time depends on how many
requests decode in it and how many prompt tokens ride along, which depends on the queue, which
depends on the step time; p95s come from the bursts of a random arrival process, which means
formulas cannot give without assumptions that fail at exactly the loads that matter. The engine's
scheduling is simple enough to replay: seats (max_num_seqs, or what the KV cache holds), a token
budget per step, decodes first (one token each), prompt chunks first come first served in what is
left, the first token sampled by the step that finishes a prompt.

Arrivals are Poisson (a replica's share of a fleet's load under random routing is Poisson too;
the gateway's least-loaded routing does better, so the plan errs on the safe side). Each request has
the same prompt and output length. The SLIs are the platform's (controlplane/slo/sli.py): TTFT per
request, and each request's mean inter-token latency, their p95s over the requests that arrived
after the first tenth (the empty start is not the steady state).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from .curve import LoadCurve


@dataclass(frozen=True, slots=True)
class Load:
    rps: float  # requests per second arriving at this replica
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Outcome:
    ttft_p95: float  # seconds
    itl_p95: float  # seconds (p95 over requests of each one's mean inter-token latency)
    utilisation: float  # share of the simulated time the replica was stepping
    requests: int  # requests measured (arrivals after the warm-up tenth that finished)
    seats: int
    saturated: bool  # the queue was still growing at the end: this load is more than the replica serves


def simulate(curve: LoadCurve, load: Load, *, requests: int = 1500, seed: int = 0,
             overhead_seconds: float = 0.0) -> Outcome:
    """`overhead_seconds`: what the path in front of the engine adds to each TTFT (gateway, HTTP)."""
    if load.rps <= 0 or load.prompt_tokens < 1 or load.output_tokens < 1:
        raise ValueError("simulate: rps, prompt_tokens and output_tokens must be positive")
    rng = random.Random(seed)
    per_request = load.prompt_tokens + load.output_tokens
    seats = max(1, min(curve.max_num_seqs, curve.kv_cache_tokens // per_request))
    budget = curve.max_num_batched_tokens
    arrivals = deque()
    t = 0.0
    for _ in range(requests):
        t += rng.expovariate(load.rps)
        arrivals.append(t)
    skip = requests // 10
    waiting: deque[tuple[int, float]] = deque()  # (index, arrival)
    prefilling: list[list] = []  # [index, arrival, prompt tokens left]
    decoding: list[list] = []  # [index, tokens so far, first token time, context]
    ttfts: list[float] = []
    itls: list[float] = []
    index = 0
    now = busy = 0.0
    done = 0
    backlog = None  # requests waiting for a seat when the last one arrived
    while done < requests:
        while arrivals and arrivals[0] <= now:
            waiting.append((index, arrivals.popleft()))
            index += 1
        if backlog is None and not arrivals:
            backlog = len(waiting)
        if not waiting and not prefilling and not decoding:
            now = arrivals[0]  # idle until the next arrival
            continue
        while waiting and len(prefilling) + len(decoding) < seats:
            i, arrived = waiting.popleft()
            prefilling.append([i, arrived, load.prompt_tokens])
        left = budget - len(decoding)
        chunk = 0
        finishing_prefill = []
        for p in prefilling:
            if left <= 0:
                break
            take = min(p[2], left)
            p[2] -= take
            left -= take
            chunk += take
            if p[2] == 0:
                finishing_prefill.append(p)
        context = sum(d[3] for d in decoding) / len(decoding) if decoding else 0.0
        step = curve.step_seconds(len(decoding), chunk, context)
        now += step
        busy += step
        still = []
        for d in decoding:
            d[1] += 1
            d[3] += 1
            if d[1] >= load.output_tokens:
                done += 1
                if d[0] >= skip:
                    itls.append((now - d[2]) / (load.output_tokens - 1))
            else:
                still.append(d)
        decoding = still
        for p in finishing_prefill:
            prefilling.remove(p)
            if p[0] >= skip:
                ttfts.append(now - p[1] + overhead_seconds)
            if load.output_tokens == 1:
                done += 1
            else:
                decoding.append([p[0], 1, now, load.prompt_tokens + 1])
    saturated = (backlog or 0) > seats  # arrivals outran the replica: its queue kept growing
    return Outcome(ttft_p95=_p95(ttfts), itl_p95=_p95(itls) if itls else 0.0,
                   utilisation=min(busy / now, 1.0) if now else 0.0, requests=len(ttfts), seats=seats,
                   saturated=saturated)


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
