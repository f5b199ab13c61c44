"""How many lines of a batch job a dispatcher keeps in flight.

The job fills capacity nobody else wants. It starts at the ceiling the batch class admits,
halves the moment the server refuses a line (429/503) and waits as told, and grows back by
one line per window of successes. Higher classes come first: while realtime or normal work
is queued for the model no line starts, and while such work is merely running (and for a
moment after), at most a few lines are in flight, so the replica's batch-class passes stay
short and a realtime request waits behind little. Pure: the dispatcher reads it,
tests drive it with their own clock.
"""

from __future__ import annotations

from typing import Literal

Others = Literal["idle", "active", "queued"]  # realtime/normal work for the same models

# After higher-class work was last seen, how long the small share holds: a closed-loop
# client has gaps between its requests that are no invitation to fill the model.
ACTIVE_HOLD_S = 0.5
# Lines that may run beside higher-class work: a pass of this many short texts costs a
# realtime request about what one of its own passes does.
BESIDE_OTHERS = 8


class Pace:
    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.window = ceiling
        self._grown = 0.0
        self.resume_at = 0.0  # monotonic time before which no new line starts
        self._shared_until = 0.0

    def may_start(self, in_flight: int, now: float, others: Others) -> bool:
        if others == "queued" or now < self.resume_at:
            return False
        if others == "active":
            self._shared_until = now + ACTIVE_HOLD_S
        limit = self.window
        if now < self._shared_until:
            limit = min(limit, BESIDE_OTHERS)
        return in_flight < limit

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
