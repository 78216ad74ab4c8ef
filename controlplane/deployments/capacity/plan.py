"""Replicas for a load at a tier's targets, and what the tokens cost at that size.

A replica's capacity is the largest arrival rate whose simulated TTFT and ITL p95s (simulate.py)
stay within the targets, found by bisection; the plan is the fewest replicas that keep each one's
share of the load within it, checked once more by simulating that share (a p95 of a finite run is
not exactly monotone in the rate). Cost: the worker class's hourly rate times the replicas, over
the tokens an hour of that load carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from .curve import LoadCurve
from .simulate import Load, Outcome, simulate

MAX_REPLICAS = 1024
COST_PLACES = Decimal("0.000001")


class PlanError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Targets:
    ttft_seconds: float
    itl_seconds: float

    def met(self, outcome: Outcome) -> bool:
        return (not outcome.saturated and outcome.ttft_p95 <= self.ttft_seconds
                and outcome.itl_p95 <= self.itl_seconds)


@dataclass(frozen=True, slots=True)
class Plan:
    replicas: int
    rps: float
    prompt_tokens: int
    output_tokens: int
    targets: Targets
    replica_rps: float  # the most one replica holds at the targets
    at_plan: Outcome  # one replica's share of the load, simulated
    one_fewer: Outcome | None  # the same with a replica less (why not fewer), None at 1
    hourly_cost: Decimal | None  # the fleet's, None when the class has no rate
    currency: str
    cost_per_million_tokens: Decimal | None  # input and output tokens together
    cost_per_thousand_requests: Decimal | None


def replica_capacity(curve: LoadCurve, prompt_tokens: int, output_tokens: int, targets: Targets, *,
                     overhead_seconds: float = 0.0, seed: int = 0) -> float:
    """Requests per second one replica holds within the targets (bisection to 2 %)."""
    def ok(rps: float) -> bool:
        return targets.met(simulate(curve, Load(rps, prompt_tokens, output_tokens), seed=seed,
                                    overhead_seconds=overhead_seconds))

    low = 1e-3
    if not ok(low):
        alone = simulate(curve, Load(low, prompt_tokens, output_tokens), requests=200, seed=seed,
                         overhead_seconds=overhead_seconds)
        raise PlanError(f"no load meets the targets on this worker class: one request alone has TTFT "
                        f"{alone.ttft_p95 * 1000:.0f} ms and ITL {alone.itl_p95 * 1000:.1f} ms against "
                        f"{targets.ttft_seconds * 1000:.0f} ms and {targets.itl_seconds * 1000:.1f} ms")
    high = 1.0
    while ok(high):
        low, high = high, high * 2
        if high > 1e6:
            return low
    while high - low > 0.02 * low:
        mid = (low + high) / 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def plan_replicas(curve: LoadCurve, *, rps: float, prompt_tokens: int, output_tokens: int, targets: Targets,
                  hourly_rate: Decimal | None = None, currency: str = "usd", overhead_seconds: float = 0.0,
                  seed: int = 0) -> Plan:
    if not (rps > 0 and math.isfinite(rps)):
        raise PlanError("rps must be a positive number")
    if prompt_tokens < 1 or output_tokens < 1:
        raise PlanError("prompt and output tokens must be positive")
    if prompt_tokens + output_tokens > curve.kv_cache_tokens:
        raise PlanError(f"a request of {prompt_tokens + output_tokens} tokens does not fit this worker's KV cache "
                        f"({curve.kv_cache_tokens} tokens)")
    capacity = replica_capacity(curve, prompt_tokens, output_tokens, targets, overhead_seconds=overhead_seconds,
                                seed=seed)
    replicas = max(1, math.ceil(rps / capacity))

    def share(n: int) -> Outcome:
        return simulate(curve, Load(rps / n, prompt_tokens, output_tokens), seed=seed,
                        overhead_seconds=overhead_seconds)

    at_plan = share(replicas)
    while not targets.met(at_plan) and replicas < MAX_REPLICAS:
        replicas += 1
        at_plan = share(replicas)
    if replicas >= MAX_REPLICAS and not targets.met(at_plan):
        raise PlanError(f"more than {MAX_REPLICAS} replicas would be needed")
    hourly = cost_m = cost_k = None
    if hourly_rate is not None:
        hourly = hourly_rate * replicas
        tokens_per_hour = Decimal(str(rps)) * 3600 * (prompt_tokens + output_tokens)
        requests_per_hour = Decimal(str(rps)) * 3600
        cost_m = (hourly * 1_000_000 / tokens_per_hour).quantize(COST_PLACES, ROUND_HALF_UP)
        cost_k = (hourly * 1000 / requests_per_hour).quantize(COST_PLACES, ROUND_HALF_UP)
    return Plan(replicas=replicas, rps=rps, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                targets=targets, replica_rps=capacity, at_plan=at_plan,
                one_fewer=share(replicas - 1) if replicas > 1 else None, hourly_cost=hourly, currency=currency,
                cost_per_million_tokens=cost_m, cost_per_thousand_requests=cost_k)
