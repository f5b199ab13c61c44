"""How long a request would take if admitted now, and how wrong that guess has been.

The guess is the floor of a call's latency (the least a request takes, whatever waits
ahead: the hop, one pass) plus the work ahead of it and its own, divided by the model's
service rate (`busy_rate`). The guess knows nothing of how the replica orders classes, of
a pass of another class it must sit behind, or of a neighbour taking the CPU; so each class
keeps a correction: a high quantile of measured/guessed latency over the requests it
admitted, tracked by stochastic approximation. It rises fast when answers come late and
falls slowly when they come early (as CoDel reacts to a sojourn time above its target at
once and relaxes gradually), so the corrected guess is one that about `quantile` of
admitted requests beat.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from deployments.core.busy_rate import BusyRate
from deployments.core.priority import ALL_PRIORITIES, Priority


@dataclass(frozen=True)
class Prediction:
    seconds: float  # corrected: what admission compares with the request's budget
    raw_s: float  # before the correction: what the measured latency is compared with


class RatioQuantile:
    """The `quantile`-quantile of a stream of ratios, as a multiplicative random walk: up by
    step x quantile when a ratio is above it, down by step x (1 - quantile) otherwise, so
    it settles where a share 1 - quantile of ratios lie above it."""

    def __init__(
        self,
        quantile: float = 0.9,
        step: float = 0.1,
        low: float = 0.25,
        high: float = 16.0,
    ) -> None:
        if not 0 < quantile < 1 or not 0 < step < 1 or not 0 < low <= 1 <= high:
            raise ValueError("need 0 < quantile < 1, 0 < step < 1, low <= 1 <= high")
        self._up = 1 + step * quantile
        self._down = 1 - step * (1 - quantile)
        self._low, self._high = low, high
        self.value = 1.0

    def observe(self, ratio: float) -> None:
        self.value *= self._up if ratio > self.value else self._down
        self.value = min(max(self.value, self._low), self._high)


class WaitPredictor:
    def __init__(
        self,
        rate: BusyRate | None = None,
        floor_calls: int = 64,
        # The 90th percentile, not the 99th: the walk falls by step x (1 - quantile) per
        # early answer, and at 0.99 a correction raised by a stall took half a minute to
        # come down, refusing all the while. A tail above it lands within the target's slack.
        quantile: float = 0.9,
        step: float = 0.1,
    ) -> None:
        self.rate = rate or BusyRate()
        self._calls: deque[float] = deque(maxlen=floor_calls)
        self._correction = {p: RatioQuantile(quantile, step) for p in ALL_PRIORITIES}

    def call_took(self, seconds: float) -> None:
        """A call to the model returned after `seconds` (sent to answered)."""
        self._calls.append(max(seconds, 0.0))

    def floor_s(self) -> float | None:
        return min(self._calls) if self._calls else None

    def predict(self, priority: Priority, ahead_items: int, size: int) -> Prediction | None:
        """Seconds from now to the answer of `size` items behind `ahead_items`; None until
        the rate and the floor are measured (cold start)."""
        rate = self.rate.per_s()
        floor = self.floor_s()
        if rate is None or floor is None:
            return None
        raw = floor + (ahead_items + size) / rate
        return Prediction(raw * self._correction[priority].value, raw)

    def observe(self, priority: Priority, prediction: Prediction, measured_s: float) -> None:
        """An admitted request of `priority` was answered `measured_s` after its prediction."""
        if prediction.raw_s > 0:
            self._correction[priority].observe(measured_s / prediction.raw_s)

    def report(self) -> dict[str, object]:
        floor = self.floor_s()
        return {
            **self.rate.report(),
            "call_floor_ms": None if floor is None else round(floor * 1e3, 1),
            "correction": {p.label: round(c.value, 3) for p, c in self._correction.items()},
        }
