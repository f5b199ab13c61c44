"""How many lines of a batch job a dispatcher keeps in flight.

The job fills capacity nobody else wants: it starts at the ceiling the batch class admits,
halves the moment the server refuses a line (429/503) and waits as told, stops starting
lines while realtime or normal work is queued for the model, and grows back by one line
per window of successes. Pure: the dispatcher reads it, tests drive it with fake clocks.
"""

from __future__ import annotations


class Pace:
    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.window = ceiling
        self._grown = 0.0
        self.resume_at = 0.0  # monotonic time before which no new line starts

    def may_start(self, in_flight: int, now: float, others_waiting: bool) -> bool:
        return not others_waiting and now >= self.resume_at and in_flight < self.window

    def refused(self, now: float, retry_after_s: float) -> None:
        self.window = max(1, self.window // 2)
        self._grown = 0.0
        self.resume_at = max(self.resume_at, now + retry_after_s)

    def succeeded(self) -> None:
        if self.window >= self.ceiling:
            return
        self._grown += 1.0 / self.window
        if self._grown >= 1.0:
            self._grown = 0.0
            self.window += 1
