"""Recent requests per model and class, for `GET /v1/stats` and the /status page.

Prometheus keeps the history; this keeps only what a human glancing at one ingress
replica needs now: counts since start, and over the last `window_s` seconds the request
and input rates and the latency percentiles of answered requests.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Done:
    at: float
    latency_s: float
    items: int
    ok: bool


class RecentRequests:
    def __init__(
        self,
        window_s: float = 30.0,
        max_samples: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        self._started = clock()
        # Bounded: at a high rate the window holds the latest `max_samples` requests,
        # and rates are computed over the span those cover.
        self._done: deque[_Done] = deque(maxlen=max_samples)
        self.requests = 0
        self.errors = 0

    def add(self, latency_s: float, items: int, ok: bool) -> None:
        self.requests += 1
        self.errors += 0 if ok else 1
        self._done.append(_Done(self._clock(), latency_s, items, ok))

    def summary(self) -> dict[str, Any]:
        now = self._clock()
        while self._done and now - self._done[0].at > self._window_s:
            self._done.popleft()
        answered = sorted(d.latency_s for d in self._done if d.ok)
        if len(self._done) == self._done.maxlen:
            span = now - self._done[0].at
        else:
            span = min(self._window_s, now - self._started)
        span = max(span, 1.0)  # a burst in the first second is not a rate of thousands
        return {
            "requests": self.requests,
            "errors": self.errors,
            "requests_per_s": round(sum(d.ok for d in self._done) / span, 2),
            "items_per_s": round(sum(d.items for d in self._done if d.ok) / span, 2),
            "p50_ms": _ms(percentile(answered, 0.50)),
            "p99_ms": _ms(percentile(answered, 0.99)),
        }


def percentile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list; None when it is empty."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
