"""How fast items reach one class's queue, over the last second or so.

The batch policy needs it for one decision: whether waiting for company is worth anything.
A class that gets less than one item per batch window will not fill a batch by waiting, so
its items go at once. The rate decays exponentially between arrivals, so a class that fell
silent reads as idle without anyone having to tick it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class ArrivalRate:
    def __init__(self, half_life_s: float = 0.5, clock: Callable[[], float] = time.monotonic):
        self._decay_per_s = math.log(2) / half_life_s
        self._clock = clock
        self._level = 0.0  # a decaying count of arrivals; rate = level x decay
        self._at = clock()

    def add(self, items: int) -> None:
        self._level = self._decayed() + items
        self._at = self._clock()

    def per_s(self) -> float:
        return self._decayed() * self._decay_per_s

    def _decayed(self) -> float:
        return self._level * math.exp(-self._decay_per_s * (self._clock() - self._at))
