"""The share of a replica's time its forward passes took: what its autoscaling reads.

Serve's own autoscaling counts the calls waiting at a deployment. Admission by predicted
wait keeps that count short on purpose (a request that would wait past its target is
refused, not queued), so under an overload a deployment's queue says "enough replicas"
while its one replica never rests. How busy the replica is says it: near 1 when the load
is at or above what it can do, and that share of a second replica's worth when below.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class BusyShare:
    def __init__(self, lanes: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        """`lanes`: passes the replica runs at once (each a model thread)."""
        self._lanes = max(lanes, 1)
        self._clock = clock
        self._since = clock()
        self._busy_s = 0.0

    def ran(self, seconds: float) -> None:
        """A pass took `seconds`, counted when it ended."""
        self._busy_s += max(seconds, 0.0)

    def read(self) -> float:
        """The busy share since the last reading (0 to 1); starts the next period."""
        now = self._clock()
        span = now - self._since
        busy, self._since, self._busy_s = self._busy_s, now, 0.0
        if span <= 0:
            return 0.0
        # A pass that began in an earlier period is counted whole in the one it ended in.
        return min(busy / (span * self._lanes), 1.0)
