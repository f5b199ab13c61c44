"""Token buckets for per-tenant rate limits (requests/s and tokens/s, with a burst)."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`rate` units per second accumulate up to `burst`. A take larger than the burst is
    allowed once the bucket is full and leaves it in debt, so a legal but large request
    is slowed down rather than refused forever."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be > 0")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._level = burst
        self._stamp = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._level = min(self.burst, self._level + (now - self._stamp) * self.rate)
        self._stamp = now
        return self._level

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` could be taken (0 when it can be now)."""
        missing = min(amount, self.burst) - self._refill()
        # Float rounding can leave a hair's breadth missing after exactly the wait we
        # told the client; that must not become another refusal.
        return missing / self.rate if missing > 1e-9 else 0.0

    def take(self, amount: float) -> None:
        self._refill()
        self._level -= amount

    def give_back(self, amount: float) -> None:
        """Correct an earlier estimate (negative `amount` charges more)."""
        self._level = min(self.burst, self._level + amount)
