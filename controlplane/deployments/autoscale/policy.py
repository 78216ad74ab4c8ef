"""The autoscaler's decision: one pure function over plain dataclasses (no database, no clock).

`decide(signals, policy, history) -> Decision`. The reconciler's service (service.py) reads the
signals and the history from the database, calls this, and writes what it says; everything that
can be argued about (thresholds, cooldowns, hysteresis) is here, so it is tested exhaustively
without a database (tests/controlplane/deployments/test_autoscale_policy.py).

Up fast, down slowly:
- up: when the queue per replica is above its target, a replica's KV cache is nearly full, or a
  tier the deployment serves burns its latency error budget at the fast-burn page's rate. The queue
  says how many replicas are needed (HPA's `ceil(current x metric / target)`, at most doubling in
  one step); the KV cache and the burn rate only say "more", so they add one. At most one change
  per TESSERA_AUTOSCALE_UP_COOLDOWN_SECONDS, so a replica that is still loading is not counted
  twice.
- down: one replica at a time, only once every signal has stayed low (below the low thresholds,
  projected onto one replica fewer) for TESSERA_AUTOSCALE_DOWN_STABLE_SECONDS without a break, and
  not within TESSERA_AUTOSCALE_DOWN_COOLDOWN_SECONDS of any change. The band between the low and
  high thresholds holds and restarts that clock: this is the hysteresis that keeps a signal hovering
  at a threshold from flapping the fleet.
- never below min_replicas or above max_replicas (bounds changed by an operator apply at once);
  never down while a ready replica's worker is not reporting (a silent worker's load is unknown, and
  "unknown" must not read as "idle"); the last replica goes (min_replicas 0) only after no request
  at all for TESSERA_AUTOSCALE_IDLE_SECONDS. From zero, the gateway's first request wakes it
  (service.autoscale_wake), not this function: at zero there is no worker to report a queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Below this share of the seats (max_num_seqs) in use on one replica fewer, the fleet may shrink.
LOW_SEAT_SHARE = 0.5

# Reason codes (Decision.reason), also the `reason` label of tessera:autoscaler_decisions_total.
UP_REASONS = ("below_min", "queue", "kv_cache", "slo_burn", "cold_start")
DOWN_REASONS = ("above_max", "low_load", "idle")
HOLD_REASONS = ("steady", "at_max", "at_min", "up_cooldown", "down_cooldown", "stabilising",
                "signals_missing", "not_ready", "scaled_to_zero")


@dataclass(frozen=True, slots=True)
class Signals:
    now: float  # Unix seconds; History's clocks are on the same scale
    current: int  # the deployment's desired replicas now
    ready: int  # ready replicas that are not draining
    reporting: int  # of those, on a worker whose heartbeat is fresh: the load figures below are theirs
    running: int = 0  # requests running on the reporting replicas (their workers' num_running)
    waiting: int = 0  # requests queued on the reporting replicas (num_waiting)
    seats: int = 0  # max_num_seqs summed over the reporting replicas (0: not reported)
    kv_usage_max: float | None = None  # the fullest reporting replica's KV-cache use (0..1)
    kv_usage_mean: float | None = None  # their mean KV-cache use
    fast_burn: float | None = None  # highest 5-minute TTFT/ITL burn rate among the tiers served (None: too few requests)
    recent_requests: int = 0  # requests for the deployment in the last TESSERA_AUTOSCALE_IDLE_SECONDS

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__ if name != "now"}


@dataclass(frozen=True, slots=True)
class Policy:
    min_replicas: int
    max_replicas: int
    target_waiting: float = 4.0
    low_waiting: float = 0.5
    kv_high: float = 0.85
    kv_low: float = 0.5
    burn_high: float = 14.4
    burn_low: float = 1.0
    up_cooldown: float = 30.0
    down_cooldown: float = 300.0
    down_stable: float = 300.0
    idle_seconds: float = 900.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"min_replicas/max_replicas: need 0 <= min <= max and max >= 1, got "
                             f"{self.min_replicas}/{self.max_replicas}")
        if not 0 <= self.low_waiting < self.target_waiting:
            raise ValueError(f"low_waiting: must be in [0, target_waiting), got {self.low_waiting}")
        if not 0 <= self.kv_low < self.kv_high <= 1:
            raise ValueError(f"kv_low/kv_high: need 0 <= low < high <= 1, got {self.kv_low}/{self.kv_high}")
        if not 0 <= self.burn_low < self.burn_high:
            raise ValueError(f"burn_low/burn_high: need 0 <= low < high, got {self.burn_low}/{self.burn_high}")


@dataclass(frozen=True, slots=True)
class History:
    last_up_at: float | None = None  # Unix seconds of the last increase (a cold start counts)
    last_down_at: float | None = None
    low_since: float | None = None  # since when every signal has been low, without a break


@dataclass(frozen=True, slots=True)
class Decision:
    current: int  # desired replicas before
    desired: int  # desired replicas after (== current: hold)
    reason: str  # a code from UP_REASONS, DOWN_REASONS or HOLD_REASONS
    detail: str  # one sentence with the numbers behind it
    low_since: float | None  # History.low_since for the next pass

    @property
    def direction(self) -> str:
        return "up" if self.desired > self.current else "down" if self.desired < self.current else "hold"


def _hold(s: Signals, reason: str, detail: str, low_since: float | None = None) -> Decision:
    return Decision(s.current, s.current, reason, detail, low_since)


def _up_wanted(s: Signals, p: Policy) -> tuple[int, str, str]:
    """(replicas wanted, reason, detail) from the pressure signals; (current, "", "") without pressure."""
    wants: list[tuple[int, str, str]] = []
    per = s.waiting / s.reporting if s.reporting else 0.0
    if s.reporting and per > p.target_waiting:
        n = max(s.current + 1, math.ceil(s.current * per / p.target_waiting))
        wants.append((min(n, 2 * s.current), "queue",
                      f"{per:.1f} requests waiting per replica > {p.target_waiting:g}"))
    if s.kv_usage_max is not None and s.kv_usage_max > p.kv_high:
        wants.append((s.current + 1, "kv_cache", f"KV cache {s.kv_usage_max:.0%} used > {p.kv_high:.0%}"))
    if s.fast_burn is not None and s.fast_burn > p.burn_high:
        wants.append((s.current + 1, "slo_burn", f"5-minute latency burn rate {s.fast_burn:.1f} > {p.burn_high:g}"))
    if not wants:
        return s.current, "", ""
    return max(wants, key=lambda w: w[0])


def _low(s: Signals, p: Policy, target: int) -> str:
    """'' when every signal is low enough to run on `target` replicas; else why not."""
    if s.fast_burn is not None and s.fast_burn > p.burn_low:
        return f"burn rate {s.fast_burn:.1f} > {p.burn_low:g}"
    if target == 0:
        if s.running or s.waiting or s.recent_requests:
            return (f"in use ({s.running} running, {s.waiting} waiting, {s.recent_requests} requests in the last "
                    f"{p.idle_seconds:.0f} s)")
        return ""
    n = min(s.reporting, target)  # what the same load would be spread over
    per = s.waiting / n
    if per > p.low_waiting:
        return f"{per:.1f} waiting per replica on {n} > {p.low_waiting:g}"
    if s.kv_usage_mean is not None and s.kv_usage_mean * s.reporting / n > p.kv_low:
        return f"KV cache {s.kv_usage_mean * s.reporting / n:.0%} on {n} > {p.kv_low:.0%}"
    if s.seats and (s.running + s.waiting) > LOW_SEAT_SHARE * s.seats * n / s.reporting:
        return f"{s.running + s.waiting} requests would fill over {LOW_SEAT_SHARE:.0%} of {n} replicas' seats"
    return ""


def decide(s: Signals, p: Policy, h: History) -> Decision:
    if s.current < p.min_replicas:
        return Decision(s.current, p.min_replicas, "below_min", f"min_replicas is {p.min_replicas}", None)
    if s.current > p.max_replicas:
        return Decision(s.current, p.max_replicas, "above_max", f"max_replicas is {p.max_replicas}", None)
    if s.current == 0:
        return _hold(s, "scaled_to_zero", "no replica; the first request wakes one")
    if s.ready == 0:
        return _hold(s, "not_ready", f"none of {s.current} replicas is ready yet: no load to read")

    want, reason, detail = _up_wanted(s, p)
    if want > s.current:
        if s.current >= p.max_replicas:
            return _hold(s, "at_max", f"{detail}; already at max_replicas {p.max_replicas}")
        since = None if h.last_up_at is None else s.now - h.last_up_at
        if since is not None and since < p.up_cooldown:
            return _hold(s, "up_cooldown", f"{detail}; last increase {since:.0f} s ago (< {p.up_cooldown:g} s)")
        return Decision(s.current, min(want, p.max_replicas), reason, detail, None)

    if s.reporting < s.ready:
        return _hold(s, "signals_missing", f"{s.ready - s.reporting} of {s.ready} ready replicas' workers are not "
                     "reporting: their load is unknown, so nothing is removed")
    target = s.current - 1
    if target < p.min_replicas:
        return _hold(s, "at_min", f"at min_replicas {p.min_replicas}")
    why_not = _low(s, p, target)
    if why_not:
        return _hold(s, "steady", why_not)  # not low: the stability clock restarts
    low_since = h.low_since if h.low_since is not None else s.now
    stable = s.now - low_since
    if stable < p.down_stable:
        return _hold(s, "stabilising", f"low for {stable:.0f} s of the {p.down_stable:g} s needed", low_since)
    changes = [t for t in (h.last_up_at, h.last_down_at) if t is not None]
    since = s.now - max(changes) if changes else None
    if since is not None and since < p.down_cooldown:
        return _hold(s, "down_cooldown", f"last change {since:.0f} s ago (< {p.down_cooldown:g} s)", low_since)
    if target == 0:
        return Decision(s.current, 0, "idle", f"no request for {p.idle_seconds:g} s", None)
    return Decision(s.current, target, "low_load", f"every signal low for {stable:.0f} s", None)
