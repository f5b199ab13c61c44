"""Recent throughput, for telling a refused client how long to wait."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable


class RateMeter:
    """Units completed per second over the last `window_s` seconds."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._window_s = window_s
        self._clock = clock
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, units: int) -> None:
        now = self._clock()
        self._events.append((now, units))
        self._total += units
        self._trim(now)

    def rate(self) -> float:
        now = self._clock()
        self._trim(now)
        if not self._events:
            return 0.0
        span = max(now - self._events[0][0], 1.0)
        return self._total / span

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][0] > self._window_s:
            self._total -= self._events.popleft()[1]


def retry_after_s(units_ahead: int, per_second: float, ceiling_s: float = 60.0) -> int:
    """Whole seconds to drain `units_ahead` at the recent rate; 1 when the rate is unknown."""
    if per_second <= 0:
        return 1
    return int(min(ceiling_s, max(1, math.ceil(units_ahead / per_second))))
