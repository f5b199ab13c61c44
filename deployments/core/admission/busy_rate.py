"""How fast a model gets through work (tokens for the encoders) while it has some: the
service rate that admission divides the work ahead of a request by.

Work answered per second of wall time is the arrival rate whenever the model keeps up, and
under light load that says nothing of what it could do. So time counts only while at least
one call is out (the model, or the hop to it, is busy), in windows of `window_s` busy
seconds. The rate is the best window of the last `horizon` ones: a model answers faster
per token in full batches than in small ones, and admission keeps the queue short, so the
rate of the moment would fall with every request refused and refuse more in turn. The
best recent window is what the model has shown it can do; when it can no longer (a
neighbour took the CPU), the predictor's fit sees answers come late.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class BusyRate:
    def __init__(
        self,
        window_s: float = 1.0,
        horizon: int = 30,
        min_work: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._min_work = min_work
        self._clock = clock
        self._out = 0  # calls started and not yet ended
        self._last = 0.0  # when busy time was last booked
        self._busy_s = 0.0  # in the open window
        self._work = 0
        self._windows: deque[float] = deque(maxlen=horizon)  # closed windows' rates

    def started(self) -> None:
        if self._out == 0:
            self._last = self._clock()  # idle time before this call is not service time
        self._out += 1

    def ended(self, work: int) -> None:
        """A call ended; `work` it answered (0 for a call that failed)."""
        if self._out == 0:
            return
        now = self._clock()
        self._busy_s += max(now - self._last, 0.0)
        self._last = now
        self._work += work
        self._out -= 1
        if self._busy_s >= self._window_s:
            if self._work >= self._min_work:
                self._windows.append(self._work / self._busy_s)
            self._busy_s, self._work = 0.0, 0

    def per_s(self) -> float | None:
        """Work per busy second, the best recent window; None before the first one."""
        return max(self._windows) if self._windows else None

    def report(self) -> dict[str, float | int | None]:
        rate = self.per_s()
        return {
            "work_per_busy_s": None if rate is None else round(rate, 1),
            "last_window_work_per_busy_s": round(self._windows[-1], 1) if self._windows else None,
            "windows": len(self._windows),
        }
