"""How fast a model gets through items while it has work: the service rate that admission
divides the work ahead of a request by.

Items answered per second of wall time is the arrival rate whenever the model keeps up, and
under light load that says nothing of what it could do. So time counts only while at least
one call is out (the model, or the hop to it, is busy), and the window is the last
`window_s` seconds of such busy time: a burst after a quiet hour is measured by the burst,
not diluted by the hour.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class BusyRate:
    def __init__(
        self,
        window_s: float = 3.0,
        min_items: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._min_items = min_items
        self._clock = clock
        self._out = 0  # calls started and not yet ended
        self._last = 0.0  # when busy time was last booked
        # (busy seconds, items) per booked stretch, oldest first, about `window_s` in all
        self._samples: deque[tuple[float, int]] = deque()
        self._busy_s = 0.0
        self._items = 0

    def started(self) -> None:
        now = self._clock()
        if self._out == 0:
            self._last = now  # idle time before this call is not service time
        self._out += 1

    def ended(self, items: int) -> None:
        """A call ended; `items` it answered (0 for a call that failed)."""
        if self._out == 0:
            return
        self._book(items)
        self._out -= 1

    def per_s(self) -> float | None:
        """Items per busy second over the window; None until `min_items` were measured."""
        if self._items < self._min_items or self._busy_s <= 0:
            return None
        return self._items / self._busy_s

    def report(self) -> dict[str, float | int | None]:
        rate = self.per_s()
        return {
            "items_per_busy_s": None if rate is None else round(rate, 1),
            "window_busy_s": round(self._busy_s, 2),
            "window_items": self._items,
        }

    def _book(self, items: int) -> None:
        now = self._clock()
        busy = max(now - self._last, 0.0)
        self._last = now
        self._samples.append((busy, items))
        self._busy_s += busy
        self._items += items
        # Keep at least one sample: a single long call is still the best figure there is.
        while len(self._samples) > 1 and self._busy_s - self._samples[0][0] >= self._window_s:
            old_busy, old_items = self._samples.popleft()
            self._busy_s -= old_busy
            self._items -= old_items
