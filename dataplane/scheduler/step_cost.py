"""An online model of a step's time against its scheduled tokens, for the ITL guard's step budget.

A decode step's time is the inter-token latency of every request in it, and on a CPU it grows with
the step's tokens: t = a + b * tokens fits the small steps that matter here (a decode batch of a
few requests plus a prefill chunk) well enough to answer "how many tokens fit in 80 ms". The fit is
least squares over exponentially decayed sums, so it follows the host (threads, contention,
context lengths) within a few dozen steps and costs a handful of float operations per step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepCostModel:
    decay: float = 0.98  # weight kept by each older step per new one (half-life ~34 steps)
    min_steps: int = 8  # steps observed before the model answers
    min_spread: float = 2.0  # tokens of spread (std dev) needed to trust the slope
    # decayed sums of weight, x (tokens), y (seconds), x^2 and x*y
    _w: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0
    _n: int = 0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        d = self.decay
        self._w = self._w * d + 1.0
        self._x = self._x * d + tokens
        self._y = self._y * d + seconds
        self._xx = self._xx * d + tokens * tokens
        self._xy = self._xy * d + tokens * seconds
        self._n += 1

    def fit(self) -> tuple[float, float] | None:
        """(seconds per step, seconds per token), or None until enough varied steps were seen."""
        if self._n < self.min_steps:
            return None
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        if var < self.min_spread**2:
            return None  # every step had about the same size: the slope is not known
        slope = (self._xy / self._w - mx * my) / var
        slope = max(slope, 1e-6)  # noise can tilt it negative; more tokens never cost less
        return max(my - slope * mx, 0.0), slope

    def tokens_within(self, seconds: float) -> int | None:
        """The most tokens a step may carry and still be predicted to take at most `seconds`."""
        f = self.fit()
        if f is None:
            return None
        base, per_token = f
        return max(int((seconds - base) / per_token), 0)
