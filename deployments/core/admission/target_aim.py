"""How much of its latency target a class's admission aims at, from how often it missed.

The wait predictor admits a request when base + slope x q + the residuals' 90th percentile
fits in the target: about nine in ten admitted requests are expected within it. The target
is a p99, and what the predictor cannot see (a stall of the ingress, a pass of another
model on the cores, a burst that lands between two refits) puts more than one in a hundred
past it: in the 10 minutes at 2x capacity, normal's p99 was 748 ms against 500.

So normal and batch each keep a share of their target to aim at (realtime, never shed,
aims at the whole of its own: class_queues.py): admission compares the prediction with
`aim x target` (never the deadline: that is the client's). Every second, if more than
ALLOWED_MISS of the requests answered in it missed the target, the aim falls by a factor
that grows with the excess; if fewer than half that missed, it climbs back by AIM_STEP.
Multiplicative decrease and additive increase, as TCP's congestion window: a tail that
keeps missing is cut fast, and a calm second gives back only a little, so the aim settles
just under where misses start. AIM_FLOOR keeps admission from shutting on a class whose
misses come from somewhere no refusal helps (its own target beaten by a stall of a few
hundred ms): at the floor the fit and the fixed bounds still decide.

A second with fewer than MIN_ANSWERS answers says too little about a p99 to cut the aim;
but a quiet spell without a late answer gives it back, AIM_STEP for each second it lasted,
or a class cut down in a flood would keep refusing a light load that finds two requests
ahead of it long after the flood.
"""

from __future__ import annotations

import time
from collections.abc import Callable

ALLOWED_MISS = 0.01  # the target is a p99
WINDOW_S = 1.0
MIN_ANSWERS = 20
AIM_FLOOR = 0.3
AIM_STEP = 0.02
# The decrease: the aim is multiplied by max(DECREASE_FLOOR, 1 - DECREASE_GAIN x excess),
# where excess is the share that missed beyond ALLOWED_MISS: 6 % missing cuts it by 10 %.
DECREASE_GAIN = 2.0
DECREASE_FLOOR = 0.7


class TargetAim:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._aim = 1.0
        self._window_start = clock()
        self._answered = 0
        self._missed = 0
        self.last_miss_share: float | None = None
        self.cuts = 0

    @property
    def aim(self) -> float:
        self._close_window(self._clock())
        return self._aim

    def answered(self, seconds: float, target_s: float) -> None:
        """An admitted request was answered (or ran out of time) `seconds` after it arrived."""
        self._close_window(self._clock())
        self._answered += 1
        if seconds > target_s:
            self._missed += 1

    def _close_window(self, now: float) -> None:
        elapsed = now - self._window_start
        if elapsed < WINDOW_S:
            return
        if self._answered < MIN_ANSWERS:
            if not self._missed:
                self._aim = min(1.0, self._aim + AIM_STEP * int(elapsed / WINDOW_S))
        else:
            self._judge(self._missed / self._answered)
        self._window_start = now
        self._answered = 0
        self._missed = 0

    def _judge(self, share: float) -> None:
        self.last_miss_share = share
        if share > ALLOWED_MISS:
            cut = max(DECREASE_FLOOR, 1.0 - DECREASE_GAIN * (share - ALLOWED_MISS))
            self._aim = max(AIM_FLOOR, self._aim * cut)
            self.cuts += 1
        elif share < ALLOWED_MISS / 2:
            self._aim = min(1.0, self._aim + AIM_STEP)

    def report(self) -> dict[str, float | int | None]:
        share = self.last_miss_share
        return {
            "aim": round(self.aim, 3),
            "missed_share": None if share is None else round(share, 4),
            "cuts": self.cuts,
        }
