"""Fair sharing between tenants of one priority: the Virtual Token Counter (VTC).

After "Fairness in Serving Large Language Models" (Sheng et al., OSDI 2024). Each tenant has a
counter of the weighted service it received: `input_weight` per prompt token computed plus
`output_weight` per token generated, divided by the tenant's weight (a tier's share: weight 2 is
served twice the tokens of weight 1 under saturation). The waiting request of the tenant with the
smallest counter goes first.

A tenant that becomes active (it had nothing in the engine) is lifted to the smallest counter of
the active tenants, so time spent idle is not banked as credit: coming back after an hour buys no
burst, only an equal footing. The lift's floor never decreases (arrivals start at it, charges only
raise counters), so an idle tenant at or below it carries no information and is forgotten; idle
tenants above it (they were over-served and must not erase that by leaving briefly) are kept up
to `max_idle` entries, the lowest dropped first. Memory is bounded by active tenants + max_idle.

Where fairness sits among the scheduler's rules (`order`): priority and aging decide which *slots*
of the queue a tier holds (exactly as without fairness), and fairness decides which of the tier's
requests fills each slot; the slot's age and arrival rank go with it (`Request.aged_from`, `seq`),
so the tier's ages leave the queue oldest first and other tiers see the same queue as without
fairness. Comparing aged priorities request by request instead would hand a flood back its
starvation: its oldest requests age past any newcomer of the same tier within `aging_seconds`.
For the same reason aging does not preempt another tenant's request of the same tier. Background
pausing and the ITL guard read base priorities and are untouched. With one tenant per tier the
order is exactly the unfair one.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from dataplane.request import Request

ANONYMOUS = ""  # requests that name no tenant share one bucket
MAX_WEIGHT = 1000.0  # a share beyond this is a typo, not a tier


def tenant_key(req: Request) -> str:
    return req.tenant or ANONYMOUS


class VirtualTokenCounter:
    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0, max_idle: int = 4096) -> None:
        self.input_weight = input_weight
        self.output_weight = output_weight
        self.max_idle = max_idle
        self.counters: dict[str, float] = {}  # weighted service per tenant (active, or idle above the floor)
        self.active: set[str] = set()  # tenants with a request in the engine at the last `observe`
        self.floor = 0.0  # what arrivals are lifted to: the smallest active counter; never decreases

    def observe(self, requests: Iterable[Request]) -> None:
        """The engine's requests (waiting and running) this step: lift newcomers, forget the idle."""
        now_active = {tenant_key(r) for r in requests}
        staying, left = self.active & now_active, self.active - now_active
        if staying:
            self.floor = max(self.floor, min(self.counters[t] for t in staying))
        elif left:
            # The engine emptied: the next arrivals start where the last ones left off (the paper's
            # rule when its queue empties), so nobody's earlier absence counts as credit.
            self.floor = max(self.floor, max(self.counters[t] for t in left))
        for t in now_active - self.active:
            self.counters[t] = max(self.counters.get(t, 0.0), self.floor)  # lift on arrival
        self.active = now_active
        if left:
            self._forget(left)

    def _forget(self, left: set[str]) -> None:
        for t in left:
            if self.counters[t] <= self.floor:
                del self.counters[t]  # a return would be lifted to the floor anyway
        idle = len(self.counters) - len(self.active)
        if idle > self.max_idle:
            excess = sorted((c, t) for t, c in self.counters.items() if t not in self.active)[: idle - self.max_idle]
            for _, t in excess:
                del self.counters[t]

    def charge(self, req: Request, prompt_tokens: int, output_tokens: int) -> None:
        """Service a request received in one step: prompt tokens computed, tokens generated."""
        cost = self.input_weight * prompt_tokens + self.output_weight * output_tokens
        if cost:
            t = tenant_key(req)
            self.counters[t] = self.counters.get(t, self.floor) + cost / req.tenant_weight

    def counter(self, tenant: str | None) -> float:
        return self.counters.get(tenant or ANONYMOUS, self.floor)

    def order(self, waiting: list[Request], rank: Callable[[Request], Any]) -> list[Request]:
        """The waiting queue in admission order: `rank`'s slots per tier, filled tenant-fairly."""
        slots = sorted(waiting, key=rank)
        tiers: dict[int, list[int]] = defaultdict(list)  # base priority -> its slots, in rank order
        for i, r in enumerate(slots):
            tiers[r.priority].append(i)
        out = list(slots)
        for positions in tiers.values():
            members = [slots[i] for i in positions]
            if len({tenant_key(r) for r in members}) > 1:
                # Each slot's age and arrival rank go with it to the request that fills it, so the tier's
                # ages leave the queue oldest first, as without fairness, and other tiers see no change.
                ages = [(r.times.arrival if r.aged_from is None else r.aged_from, r.seq) for r in members]
                for i, r, (age, seq) in zip(positions, self._interleave(members), ages, strict=True):
                    out[i], r.aged_from, r.seq = r, age, seq
        return out

    def _interleave(self, members: list[Request]) -> list[Request]:
        """One tier's requests (in rank order) by VTC: the least-served tenant's next request, then
        that tenant's counter as if its prompt were already served, so one step's admissions alternate."""
        queues: dict[str, list[Request]] = defaultdict(list)
        for r in members:
            queues[tenant_key(r)].append(r)
        heap = [(self.counter(t), q[0].seq, t, 0) for t, q in queues.items()]
        heapq.heapify(heap)
        order: list[Request] = []
        while heap:
            projected, _, t, k = heapq.heappop(heap)
            req = queues[t][k]
            order.append(req)
            if k + 1 < len(queues[t]):
                prompt = max(0, req.num_prompt_tokens - req.num_computed_tokens)
                projected += self.input_weight * prompt / req.tenant_weight
                heapq.heappush(heap, (projected, queues[t][k + 1].seq, t, k + 1))
        return order


def assign_tenant(requests: Iterable[Request], tenant: str | None, weight: float = 1.0) -> None:
    """Mark a call's engine requests (n > 1 siblings included) as one tenant's, before they are queued."""
    if not isinstance(weight, int | float) or not 0 < weight <= MAX_WEIGHT:
        raise ValueError(f"tenant_weight: must be a number in (0, {MAX_WEIGHT}], got {weight!r}")
    for r in requests:
        r.tenant = tenant or None
        r.tenant_weight = float(weight)
